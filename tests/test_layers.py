"""The package's arrows point down: rpc -> runtime -> engine, store -> cachepolicy; only the engine
imports llama_cpp; only the transport (rpc, proto, the CLI's remote backend) imports grpc; the CLI
drives no engine (it goes through the service, the RPC client or the offline backend)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parent.parent
# the folders of the repository and the import name each has
PACKAGES = {
    "cachepolicy": "sinkd.cachepolicy",
    "daemon": "sinkd.daemon",
    "evaluation": "sinkd.evaluation",
    "cli": "sinkd.cli",
    "proto": "sinkd.proto",
}
LEAVES = {"errors", "config", "metrics", "failpoints"}  # sinkd.daemon.<leaf>: anyone may import
RANK = {"engine": 1, "store": 1, "runtime": 2, "rpc": 3}


def modules() -> list[tuple[str, Path]]:
    found = []
    for folder, name in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            if "_pb2" in path.name:
                continue
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found.append((".".join([name, *parts]), path))
    return found


def imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def daemon_layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] != ["sinkd", "daemon"] or len(parts) < 3:
        return None
    return RANK.get(parts[2], 0 if parts[2] in LEAVES else None)


def test_every_arrow_points_down() -> None:
    wrong = []
    for module, path in modules():
        mine = daemon_layer(module)
        for target in imports(path):
            theirs = daemon_layer(target)
            pure = module.startswith("sinkd.cachepolicy")
            if (
                pure
                and target.startswith(("sinkd.", "grpc", "llama_cpp"))
                and not target.startswith("sinkd.cachepolicy")
            ):
                wrong.append(f"{module} -> {target}")
            if mine is not None and theirs is not None and theirs > mine:
                wrong.append(f"{module} -> {target}")
            # evaluation drives the engine (perplexity) or the service (recall), not the transport
            if module.startswith("sinkd.evaluation") and (theirs or 0) > RANK["runtime"]:
                wrong.append(f"{module} -> {target}")
    assert not wrong, wrong


def test_only_the_engine_imports_llama_cpp() -> None:
    users = {m for m, p in modules() if any(t.split(".")[0] == "llama_cpp" for t in imports(p))}
    assert users and all(m.startswith("sinkd.daemon.engine.") for m in users), users


def test_only_the_transport_imports_grpc() -> None:
    users = {m for m, p in modules() if any(t.split(".")[0] == "grpc" for t in imports(p))}
    allowed = ("sinkd.daemon.rpc.", "sinkd.proto.", "sinkd.cli.backend")
    assert all(m.startswith(allowed) for m in users), users


def test_the_cli_drives_no_engine() -> None:
    for module, path in modules():
        if module.startswith("sinkd.cli"):
            engine = {t for t in imports(path) if t.startswith("sinkd.daemon.engine")}
            # models.lock's metadata is data (models list, pull); nothing here loads a model
            assert all(t.startswith("sinkd.daemon.engine.models") for t in engine), (module, engine)


def test_the_transport_reaches_the_engine_only_through_the_runtime() -> None:
    for module, path in modules():
        if module.startswith("sinkd.daemon.rpc"):
            engine = {t for t in imports(path) if t.startswith("sinkd.daemon.engine")}
            assert not engine, (module, engine)
