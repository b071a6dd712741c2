"""An interval's incidents as the receivers operators already run take them: Alertmanager's
webhook JSON (version 4: what every receiver of Alertmanager's reads), and one JSON object per
incident for a command. Pure: the times are given, nothing is sent here (cli/alerting.py sends).

An alert is firing from the interval that raised it until the interval in which its template had
no line (`Facts.opened`, `Facts.ended`); its labels name the stream, the severity and the
template's id, never log text (the template and the lines it cites are annotations).
"""

from __future__ import annotations

import datetime
import hashlib
from typing import Any

from sinkd.narration.facts import Facts, Incident

ALERTNAME = "SinkdNarratedIncident"
NEVER = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of an alert still firing


def rfc3339(t: float) -> str:
    return (
        datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat().replace("+00:00", "Z")
    )


def labels_of(stream: str, incident: Incident) -> dict[str, str]:
    return {
        "alertname": ALERTNAME,
        "stream": stream,
        "severity": incident.severity,
        "template_id": str(incident.template_id),
    }


def fingerprint(labels: dict[str, str]) -> str:
    joined = "\0".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


def alert(
    stream: str, incident: Incident, facts: Facts, starts: float, ends: float | None
) -> dict[str, Any]:
    """One alert: firing (`ends` None) or resolved at `ends`."""
    labels = labels_of(stream, incident)
    lines = f"line {incident.first_line}" + (
        f" to {incident.last_line}" if incident.last_line > incident.first_line else ""
    )
    return {
        "status": "firing" if ends is None else "resolved",
        "labels": labels,
        "annotations": {
            "summary": f'{incident.severity.upper()} in {stream}: "{incident.template}"',
            "description": (
                f"{incident.count} lines from {lines}"
                + (" (over: no line in the next interval)." if ends is not None else ".")
            ),
            "facts": facts.render(),
            "first_line": str(incident.first_line),
            "last_line": str(incident.last_line),
        },
        "startsAt": rfc3339(starts),
        "endsAt": NEVER if ends is None else rfc3339(ends),
        "generatorURL": "",
        "fingerprint": fingerprint(labels),
    }


def webhook_payload(stream: str, alerts: list[dict[str, Any]]) -> dict[str, Any]:
    """Alertmanager's webhook body (version 4) for one stream's alerts of one interval."""
    firing = any(a["status"] == "firing" for a in alerts)
    common = {
        k: v for k, v in alerts[0]["labels"].items() if all(a["labels"].get(k) == v for a in alerts)
    }
    return {
        "version": "4",
        "groupKey": f'{{}}:{{stream="{stream}"}}',
        "truncatedAlerts": 0,
        "status": "firing" if firing else "resolved",
        "receiver": "sinkd-narrate",
        "groupLabels": {"stream": stream},
        "commonLabels": common,
        "commonAnnotations": {},
        "externalURL": "",
        "alerts": alerts,
    }


def command_event(
    stream: str, incident: Incident, facts: Facts, at: float, status: str
) -> dict[str, Any]:
    """What `--on-incident CMD` reads on its stdin, one incident a run."""
    return {
        "status": status,  # "firing" or "resolved"
        "stream": stream,
        "at": rfc3339(at),
        "incident": incident.as_dict(),
        "interval": {
            "number": facts.number,
            "first_line": facts.first_line,
            "last_line": facts.last_line,
        },
        "labels": labels_of(stream, incident),
        "facts": facts.render(),
    }
