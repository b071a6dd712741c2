"""`sinkd narrate ask` on the real model over a loghub log: which intervals each question cites,
whether they hold the lines it is about, what the model said and what the check dropped.

    python bench/narrate_ask.py --loghub DIR [--log OpenSSH_2k.log]   -> bench/results/narrate_ask.json

The log is read as a stream an hour at a time (its 2,000 lines in ten parts, each part's read time
an hour after the last), then asked: when something started, whether something was seen before,
what happened in a period, and something the log never says. A question's lines are those whose
text holds its subject; a citation is right when an interval it cites holds one of them (and, for
the first one, the first of them).
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
from typing import Any

from common import start_service, table, write

from sinkd.daemon.runtime.api import DigestOptions
from sinkd.daemon.runtime.sessions import Principal
from sinkd.narration.grounding import sentences_of, unsupported_claims, words_of

WHO = Principal("local")
QUESTIONS = [  # (question, the words its lines hold, kind)
    ("When did the authentication failures for root start?", "authentication failure", "when"),
    ("Has the POSSIBLE BREAK-IN ATTEMPT warning been seen before?", "POSSIBLE BREAK-IN", "whether"),
    ("What happened between 03:00 and 04:59?", "", "what"),
    ("Did kubernetes restart any pods?", "kubernetes", "not there"),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loghub", type=Path, required=True)
    parser.add_argument("--log", default="OpenSSH_2k.log")
    args = parser.parse_args()
    path = next(args.loghub.rglob(args.log))
    lines = path.read_text(errors="replace").splitlines()[:2000]
    svc = start_service(Path(__import__("tempfile").mkdtemp()))
    day = datetime.datetime(2026, 12, 7).astimezone()
    rows: list[list[Any]] = []
    results = []
    try:
        for part in range(10):
            at = (day + datetime.timedelta(hours=part, minutes=30)).timestamp()
            svc.narrated.clock = lambda at=at: at
            chunk = lines[200 * part : 200 * (part + 1)]
            svc.narrated.feed(WHO, "ssh", chunk, True, DigestOptions(every_lines=100))
        svc.questions.clock = lambda: (day + datetime.timedelta(hours=11)).timestamp()
        for question, subject, kind in QUESTIONS:
            answer = svc.questions.ask(WHO, "ssh", question)
            about = [n for n, text in enumerate(lines, 1) if subject and subject in text]
            spans = [(i.first_line, i.last_line) for i in answer.cites]
            if kind == "what":  # 03:00-04:59: the parts read then, lines 601-1000
                right = bool(spans) and all(a >= 601 and b <= 1000 for a, b in spans)
            elif kind == "not there":
                right = not answer.held
            else:
                held = [n for n in about if any(a <= n <= b for a, b in spans)]
                right = bool(held) and (kind != "when" or about[0] in held)
            support = words_of(answer.facts_text)
            bad = [
                s for s in sentences_of(answer.text)
                if unsupported_claims(s.removeprefix("According to the facts,"), support, min_words=1)
            ]  # fmt: skip
            results.append({
                "question": question, "kind": kind, "held": answer.held, "cites": spans,
                "subject_lines": about[:5], "right": right, "text": answer.text,
                "dropped": list(answer.dropped), "printed_unsupported": bad,
            })  # fmt: skip
            rows.append([kind, question, ", ".join(f"{a}-{b}" for a, b in spans) or "-",
                         about[0] if about else "-", right, answer.text or "(none kept)",
                         len(answer.dropped), len(bad)])  # fmt: skip
    finally:
        svc.stop()
    table(
        f"ask over {path.name} (the real model)",
        ["kind", "question", "cites (lines)", "first line it is about", "right", "said",
         "dropped", "printed unsupported"],
        rows,
    )  # fmt: skip
    print(f"wrote {write('narrate_ask', {'log': path.name, 'results': results})}")
    print(json.dumps({"right": sum(r["right"] for r in results), "of": len(results)}))


if __name__ == "__main__":
    main()
