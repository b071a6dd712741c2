"""The narrator's incidents, missed and false, from its facts alone (no model: the digest decides
what is raised, the model only phrases it): `sinkd eval narrate --incidents`'s tables, written as a
bench result.

    python bench/narrate_incidents.py --loghub DIR   -> bench/results/narrate_incidents.json

DIR holds loghub's 2k samples (github.com/logpai/loghub: `<System>/<System>_2k.log`, any folder
layout; not shipped). What is counted, and the rules compared: evaluation/narrate_incidents.py. A
web server's ordinary traffic is counted where /var/log/nginx/access.log exists
(`bench/web_traffic.py` makes it). Its last line is a JSON object: `labelled`, `unlabelled`,
`no_trouble` per log at both rules, and `pooled`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from common import table, write

from sinkd.evaluation import narrate_incidents as ni


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loghub", type=Path, required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:  # the samples by name in one folder, as read
        folder = Path(tmp)
        for path in sorted(args.loghub.rglob("*_2k.log")):
            (folder / path.name).write_bytes(path.read_bytes())
        results = ni.evaluate(folder)
    for title, columns, rows in ni.tables(results):
        table(title, columns, rows)
    print(f"wrote {write('narrate_incidents', results)}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
