"""Regenerate the Python code for proto/sinkd/v1/*.proto; `--check` fails when the committed code is stale.

Generated code is committed (so that installing sinkd needs no protoc) and excluded from linters.
"""

from __future__ import annotations

import argparse
import filecmp
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = sorted((ROOT / "proto" / "sinkd" / "v1").glob("*.proto"))
OUTPUTS = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(into: Path) -> None:
    cmd = [
        sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT}",
        f"--python_out={into}", f"--pyi_out={into}", f"--grpc_python_out={into}",
        *(str(p.relative_to(ROOT)) for p in PROTOS),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    args = parser.parse_args()
    if not args.check:
        generate(ROOT)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [
            str(p.relative_to(ROOT).with_suffix("")) + suffix
            for p in PROTOS
            for suffix in OUTPUTS
            if not (p.with_name(p.stem + suffix)).is_file()
            or not filecmp.cmp(
                Path(tmp) / p.relative_to(ROOT).with_name(p.stem + suffix),
                p.with_name(p.stem + suffix),
                shallow=False,
            )
        ]
    if stale:
        print("stale generated code (run: python proto/generate.py):", *stale, sep="\n  ")
        return 1
    print("generated code is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
