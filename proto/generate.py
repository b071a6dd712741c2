"""Regenerate the Python code for proto/v1/*.proto; `--check` fails when the committed code is stale.

Generated code is committed (so that installing sinkd needs no protoc) and excluded from linters.
protoc names the generated imports after the path it compiled, so each .proto is compiled from a
staging tree laid out as the installed package (`sinkd/proto/v1/`): the generated code then imports
`sinkd.proto.v1`, the name it is installed under.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "proto" / "v1"
PACKAGE_PATH = Path("sinkd", "proto", "v1")
PROTOS = sorted(SOURCE.glob("*.proto"))
OUTPUTS = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(into: Path) -> None:
    """Write the generated files for every .proto into the folder `into`."""
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / PACKAGE_PATH
        staged.mkdir(parents=True)
        for proto in PROTOS:
            shutil.copy(proto, staged / proto.name)
        cmd = [
            sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp}",
            f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}",
            *(str(PACKAGE_PATH / p.name) for p in PROTOS),
        ]  # fmt: skip
        subprocess.run(cmd, check=True, cwd=tmp)
        for proto in PROTOS:
            for suffix in OUTPUTS:
                shutil.copy(staged / (proto.stem + suffix), into / (proto.stem + suffix))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    args = parser.parse_args()
    if not args.check:
        generate(SOURCE)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [
            f"proto/v1/{p.stem}{suffix}"
            for p in PROTOS
            for suffix in OUTPUTS
            if not (SOURCE / (p.stem + suffix)).is_file()
            or not filecmp.cmp(
                Path(tmp) / (p.stem + suffix), SOURCE / (p.stem + suffix), shallow=False
            )
        ]
    if stale:
        print("stale generated code (run: python proto/generate.py):", *stale, sep="\n  ")
        return 1
    print("generated code is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
