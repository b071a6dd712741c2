"""sinkd installs one import name, `sinkd`: beside python-daemon (`daemon`) and proto-plus (`proto`)
all three import, each its own, from an editable install (this venv) and from a regular one (a wheel
built from this tree into a fresh venv)."""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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


# --- what the default install carries: the requirement tree read from the installed metadata ---

# the families that must never come with an edge daemon, whatever pulls them in (a GPU framework, its
# CUDA wheels, a model hub's trainer); by pattern, so that a renamed or new wheel of theirs matches
HEAVY = re.compile(
    r"^(torch|torch\w*|triton|transformers|sentence-transformers|tensorflow\S*|jax|jaxlib|"
    r"scipy|scikit-learn|pandas|sympy)$|^nvidia-|cuda|cudnn"
)
MOST_INSTALLED_BYTES = 300 * 2**20  # today ~190 MB; llama-cpp-python and numpy are 110 of it
CODE = ("sinkd", "cachepolicy", "daemon", "cli", "proto")  # not evaluation/, bench/: extras


def requirement_tree(root: str) -> dict[str, md.Distribution]:
    """The distributions `pip install root` brings, by canonical name (markers evaluated for this
    interpreter, no extras)."""
    found: dict[str, md.Distribution] = {}
    todo = [root]
    while todo:
        dist = md.distribution(todo.pop())
        name = canonicalize_name(dist.metadata["Name"])
        if name in found:
            continue
        found[name] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def imported_tops() -> set[str]:
    """The top-level modules sinkd's own code imports (any depth: lazy imports count)."""
    tops = set()
    for folder in CODE:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    tops.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    tops.add(node.module.split(".")[0])
    return tops


def test_the_default_install_brings_no_framework_and_stays_small() -> None:
    tree = requirement_tree("sinkd")
    assert "llama-cpp-python" in tree and "numpy" in tree  # the tree is read, not empty
    heavy = sorted(n for n in tree if HEAVY.search(n))
    assert not heavy, f"the default install brings {heavy}"
    size = sum(f.size or 0 for d in tree.values() for f in d.files or [])
    assert size < MOST_INSTALLED_BYTES, f"the default install is {size / 2**20:.0f} MiB"


def test_every_default_requirement_is_imported_by_sinkd() -> None:
    """A direct requirement the code never imports is weight for nothing (a plot library, a
    package that only ships a file): it belongs to an extra, or to `sinkd models pull`."""
    provides: dict[str, set[str]] = {}
    for top, dists in md.packages_distributions().items():
        for d in dists:
            provides.setdefault(canonicalize_name(d), set()).add(top)
    used = imported_tops()
    unused = []
    for line in md.requires("sinkd") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra, or another Python's
        name = canonicalize_name(req.name)
        if not provides.get(name, set()) & used:
            unused.append(name)
    assert not unused, f"required but never imported: {unused}"


def test_a_plot_without_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from sinkd.errors import Unsupported
    from sinkd.evaluation.plotting import pyplot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed: ImportError
    with pytest.raises(Unsupported, match=r"pip install 'sinkd\[plots\]'"):
        pyplot()


def test_the_engines_install_carries_only_libraries_the_daemon_loads() -> None:
    """llama-cpp-python built as the Makefile builds it installs no library that nothing sinkd
    loads links (llama.cpp's common library: deploy/llama.cpp/common-only-for-llava.patch)."""
    import llama_cpp  # noqa: F401  (loads libllama and the ggml libraries it links)

    def stem(name: str) -> str:
        return name.split(".so")[0]

    installed = {
        stem(Path(str(f)).name) for f in md.files("llama_cpp_python") or [] if ".so" in str(f)
    }
    maps = Path("/proc/self/maps").read_text()
    loaded = {stem(Path(line.split()[-1]).name) for line in maps.splitlines() if ".so" in line}
    assert {"libllama", "libggml", "libggml-base", "libggml-cpu"} <= installed & loaded
    assert installed <= loaded, f"installed, never loaded: {sorted(installed - loaded)}"
