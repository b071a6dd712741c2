"""sinkd installs one import name, `sinkd`: beside python-daemon (`daemon`) and proto-plus (`proto`)
all three import, each its own, from an editable install (this venv) and from a regular one (a wheel
built from this tree into a fresh venv)."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parent.parent
PROBE = (
    "import json, daemon, proto, sinkd, sinkd.cachepolicy, sinkd.daemon.models.registry,"
    " sinkd.proto.v1.sinkd_pb2, sinkd.proto.v1.sinkd_pb2_grpc;"
    " from sinkd.daemon.models.registry import LOCK_PATH;"
    " print(json.dumps({'daemon': daemon.__file__, 'proto': proto.__file__,"
    " 'sinkd': sinkd.__file__, 'lock': LOCK_PATH.is_file(),"
    " 'runner': hasattr(daemon, 'DaemonContext'), 'message': hasattr(proto, 'Message')}))"
)


def probe(python: str, cwd: Path) -> dict[str, object]:
    out = subprocess.run(
        [python, "-c", PROBE], cwd=cwd, capture_output=True, text=True, check=True, timeout=120
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_editable_install_shadows_neither_daemon_nor_proto(tmp_path: Path) -> None:
    found = probe(sys.executable, tmp_path)
    site = Path(sysconfig.get_paths()["purelib"])
    assert Path(str(found["daemon"])).is_relative_to(site) and found["runner"]  # python-daemon
    assert Path(str(found["proto"])).is_relative_to(site) and found["message"]  # proto-plus
    assert Path(str(found["sinkd"])).is_relative_to(ROOT) and found["lock"]


def test_a_wheel_installs_sinkd_alone(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    wheel = next((tmp_path / "dist").glob("sinkd-*.whl"))
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"sinkd"}
    names = zipfile.ZipFile(wheel).namelist()
    assert "sinkd/models.lock" in names and "sinkd/proto/v1/sinkd.proto" in names
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    with zipfile.ZipFile(wheel) as z:  # what pip would lay down, without pip in the venv
        z.extractall(site)
    # the dependencies (and python-daemon, proto-plus) come from this venv, after sinkd
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    found = probe(python, tmp_path)
    assert Path(str(found["sinkd"])).is_relative_to(site) and found["lock"]
    assert found["runner"] and found["message"]
    assert not Path(str(found["daemon"])).is_relative_to(site)
    assert not Path(str(found["proto"])).is_relative_to(site)
