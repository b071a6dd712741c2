"""Does a receiver that is down slow the narrator's reader? 100,000 lines read at the unpaced rate
(an incident every ~2,000 lines, each sent firing and resolved), with no webhook, with a receiver
that accepts and never answers (each delivery waits out its timeout), and with none listening
(each refused at once), in interleaved rounds.

    python bench/narrate_alerts.py     -> bench/results/narrate_alerts.json
    SINKD_BENCH_ROUNDS=5 python bench/narrate_alerts.py

The reader is the narrator's (`Intake.add` from a thread: every line into the digest); the main
loop takes each closed interval and hands its incidents to `Alerting`, as `sinkd narrate` does
before printing (the model's phrasing, slower than both, is left out: it is not on the reader's
path). Lines/s of the reader, and each mode over no webhook; the last line is a JSON object.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import threading
import time
from typing import Any

from common import table, write

from sinkd.cli.alerting import Alerting
from sinkd.cli.narrator import Counts, Intake, NarrateConfig

LINES = 100_000
ROUNDS = int(os.environ.get("SINKD_BENCH_ROUNDS", "3"))


def lines() -> list[str]:
    out = []
    for i in range(LINES):
        if i % 2000 in range(1000, 1010):  # a new error each time: an incident, then over
            out.append(f"2026-12-07T04:00:00 db ERROR shard {i // 2000} write failed")
        else:
            out.append(f"2026-12-07T04:00:{i % 60:02d} api INFO request {i} served in {i % 97} ms")
    return out


def hung_receiver() -> tuple[socket.socket, str]:
    """A socket that accepts and never answers: every POST waits out its timeout."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    return server, f"http://127.0.0.1:{server.getsockname()[1]}/alerts"


def refused_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nobody listens there now
    return f"http://127.0.0.1:{port}/alerts"


def run(log: list[str], webhook: str) -> dict[str, Any]:
    config = NarrateConfig(every_seconds=3600, incident_seconds=3600)
    counts = Counts()
    intake = Intake(config, counts)
    alerting = Alerting("bench", webhook)  # its pauses between tries, as it runs
    done = threading.Event()
    seconds: list[float] = []

    def read() -> None:
        start = time.perf_counter()
        for line in log:
            intake.add(line)
        seconds.append(time.perf_counter() - start)
        intake.close()
        done.set()

    reader = threading.Thread(target=read)
    reader.start()
    incidents = 0
    while True:
        cuts, ended = intake.take(0.25)
        for facts in cuts:
            incidents += len(facts.opened)
            alerting.interval(facts)
        if ended:
            break
    reader.join()
    alerting.close(drain_s=0.0)
    return {
        "lines_per_s": len(log) / seconds[0],
        "incidents": incidents,
        **alerting.counts.as_dict(),
    }


def main() -> None:
    log = lines()
    server, hung = hung_receiver()
    modes = {"no webhook": "", "receiver hung": hung, "receiver down": refused_url()}
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for rnd in range(ROUNDS):
        order = list(modes) if rnd % 2 == 0 else list(reversed(modes))
        for mode in order:
            runs[mode].append(r := run(log, modes[mode]))
            print(f"{mode}: {r['lines_per_s']:.0f} lines/s", flush=True)
    server.close()
    base = statistics.median(r["lines_per_s"] for r in runs["no webhook"])
    rows, summary = [], {}
    for mode, rs in runs.items():
        rates = [r["lines_per_s"] for r in rs]
        median = statistics.median(rates)
        summary[mode] = {"lines_per_s": median, "of_no_webhook": median / base}
        rows.append([mode, ", ".join(f"{x:.0f}" for x in rates), median, median / base,
                     rs[-1]["incidents"], rs[-1]["alerts_sent"], rs[-1]["alerts_failed"],
                     rs[-1]["alerts_dropped"] + rs[-1]["alerts_left"]])  # fmt: skip
    table(
        f"the narrator's reader, {LINES:,} lines unpaced, {ROUNDS} rounds",
        ["mode", "lines/s (rounds)", "median", "of no webhook", "incidents", "sent", "failed",
         "dropped or left"],
        rows,
    )  # fmt: skip
    print(f"wrote {write('narrate_alerts', {'rounds': ROUNDS, 'runs': runs, 'summary': summary})}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
