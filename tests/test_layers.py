"""The package's arrows point down: node -> rpc, http (the edges, which share callers/ and never
import each other) -> runtime -> engine, store, models -> cachepolicy -> sinkd.errors; inside
runtime, the service -> the conversation layer -> the session operations -> loop -> durable, recall
-> the session data (sessions, api); only the engine imports llama_cpp; only the transport (rpc,
proto) imports grpc; the CLI drives no engine (it goes through the service, the client or its
offline backend); no module takes the service whole; no `dict[str, Any]` or `(kind, payload)`
tuple crosses from the runtime to its edges."""

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
    "narration": "sinkd.narration",
    "cli": "sinkd.cli",
    "proto": "sinkd.proto",
}
LEAVES = {
    "validation",
    "config",
    "metrics",
    "failpoints",
    "private",
}  # sinkd.daemon.<leaf>: anyone may import
RANK = {
    "models": 1,
    "engine": 1,
    "store": 1,
    "runtime": 2,
    "callers": 3,  # who calls and what they may hold: shared by the edges
    "rpc": 4,
    "http": 4,
    "node": 5,  # the service and its edges put together
}
EDGES = ("sinkd.daemon.rpc", "sinkd.daemon.http", "sinkd.cli")
# inside runtime: the session data at the bottom, the session operations (its root) at the top
RUNTIME_DATA = {"sessions", "api"}
# the session operations at its root (3); the conversation layer for HTTP clients above them, and
# the service, which composes it all, on top
RUNTIME_RANK = {"recall": 1, "durable": 1, "loop": 2, "conversations": 4, "service": 5}
RUNTIME_TOP = 3


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
                and not target.startswith(("sinkd.cachepolicy", "sinkd.errors"))
            ):
                wrong.append(f"{module} -> {target}")
            # the log facts and the check: pure as the policy, shared by the CLI and evaluation
            if (
                module.startswith("sinkd.narration")
                and target.startswith(("sinkd.", "grpc", "llama_cpp"))
                and not target.startswith("sinkd.narration")
            ):
                wrong.append(f"{module} -> {target}")
            if mine is not None and theirs is not None and theirs > mine:
                wrong.append(f"{module} -> {target}")
            # evaluation drives the engine (perplexity) or the service (recall), not the transport
            if module.startswith("sinkd.evaluation") and (theirs or 0) > RANK["runtime"]:
                wrong.append(f"{module} -> {target}")
    assert not wrong, wrong


def test_the_edges_talk_to_the_service_not_its_loop_or_journal() -> None:
    """gRPC, HTTP and the CLI's embedded backend reach the runtime through the service's named
    parts: never the engine thread's loop (its scheduler, queues, jobs) or the journal."""
    wrong = []
    for module, path in modules():
        if module.startswith(EDGES):
            for target in imports(path):
                if target.startswith(("sinkd.daemon.runtime.loop", "sinkd.daemon.store.journal")):
                    wrong.append(f"{module} -> {target}")
    assert not wrong, wrong


def test_the_two_edges_do_not_import_each_other() -> None:
    wrong = []
    for module, path in modules():
        for mine, theirs in (("rpc", "http"), ("http", "rpc")):
            if module.startswith(f"sinkd.daemon.{mine}"):
                wrong += [
                    f"{module} -> {t}"
                    for t in imports(path)
                    if t.startswith(f"sinkd.daemon.{theirs}")
                ]
    assert not wrong, wrong


def runtime_layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[:3] != ["sinkd", "daemon", "runtime"] or len(parts) < 4:
        return None
    if parts[3] in RUNTIME_DATA:
        return 0
    return RUNTIME_RANK.get(parts[3], RUNTIME_TOP)


def test_inside_the_runtime_every_arrow_points_down() -> None:
    """loop/ runs the engine thread's step, durable/ the journal and snapshots, recall/ the
    memory; the session operations at runtime's root use them, and they never reach back up."""
    wrong = []
    for module, path in modules():
        mine = runtime_layer(module)
        if mine is None:
            continue
        for target in imports(path):
            theirs = runtime_layer(target)
            if theirs is None:
                continue
            same = module.split(".")[3] == target.split(".")[3]
            if theirs > mine or (theirs == mine and mine in (1, 2) and not same):
                wrong.append(f"{module} -> {target}")
    assert not wrong, wrong


@pytest.mark.parametrize("package", ["sinkd.daemon.runtime", "sinkd.daemon.http"])
def test_a_package_has_no_import_loop(package: str) -> None:
    """No module of the package reaches itself through the others' imports (those made for type
    checking or inside a function included): the HTTP front imports its three APIs, which import
    the helpers their calls share (calls.py), never the front."""
    graph: dict[str, set[str]] = {}
    names = {m for m, _ in modules()}
    for module, path in modules():
        if module.startswith(package):
            graph[module] = {t for t in imports(path) if t in names and t != module}
    state: dict[str, int] = {}

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for t in graph.get(m, ()):
            if state.get(t) == 1:
                raise AssertionError(" -> ".join([*trail, m, t]))
            if t not in state:
                visit(t, [*trail, m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])


def test_no_module_takes_the_service_whole() -> None:
    """Only the edges and the embedded backend hold a SinkdService; its parts get what they
    need (a part that took the service back made the one import loop there was)."""
    allowed = (
        "sinkd.daemon.rpc.",
        "sinkd.daemon.http.",
        "sinkd.cli.",
        "sinkd.evaluation.",
        "sinkd.daemon.runtime.service",
        "sinkd.daemon.node",
    )
    users = {
        m
        for m, p in modules()
        if "sinkd.daemon.runtime.service" in imports(p) and not m.startswith(allowed)
    }
    assert not users, users


def test_only_the_engine_imports_llama_cpp() -> None:
    users = {m for m, p in modules() if any(t.split(".")[0] == "llama_cpp" for t in imports(p))}
    assert users and all(m.startswith("sinkd.daemon.engine.") for m in users), users


def test_only_the_transport_imports_grpc() -> None:
    users = {m for m, p in modules() if any(t.split(".")[0] == "grpc" for t in imports(p))}
    allowed = ("sinkd.daemon.rpc.", "sinkd.proto.")
    assert all(m.startswith(allowed) for m in users), users


def test_the_cli_drives_no_engine() -> None:
    for module, path in modules():
        if module.startswith("sinkd.cli"):
            engine = {t for t in imports(path) if t.startswith("sinkd.daemon.engine")}
            # the offline backend (receipt, stream, models verify) is the one that loads a model
            assert not engine or module == "sinkd.cli.offline", (module, engine)


def test_the_models_package_loads_no_model() -> None:
    """The registry, the GGUF reader and the Ollama lookup read files; the CLI may use them
    without llama.cpp loaded."""
    for module, path in modules():
        if module.startswith("sinkd.daemon.models"):
            bad = {t for t in imports(path) if t.startswith(("llama_cpp", "sinkd.daemon.engine"))}
            assert not bad, (module, bad)


def test_only_the_http_front_imports_the_web_stack() -> None:
    web = ("fastapi", "starlette", "uvicorn")
    users = {m for m, p in modules() if any(t.split(".")[0] in web for t in imports(p))}
    assert users and all(m.startswith("sinkd.daemon.http.") for m in users), users


def test_the_transport_reaches_the_engine_only_through_the_runtime() -> None:
    for module, path in modules():
        if module.startswith(("sinkd.daemon.rpc", "sinkd.daemon.http")):
            engine = {t for t in imports(path) if t.startswith("sinkd.daemon.engine")}
            assert not engine, (module, engine)


def _untyped(hint: object) -> list[str]:
    """What in a type hint is untyped: Any, or a dict or a bare tuple of (kind, payload)."""
    import typing

    if hint is typing.Any:
        return ["Any"]
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    found = []
    if origin in (dict, typing.Mapping) or hint is dict:
        found.append(str(hint))
    for a in args:
        found += _untyped(a)
    return found


def test_the_runtime_answers_its_edges_in_typed_objects() -> None:
    """Every public method an edge calls (the service, its reads, turns and memory, the client,
    the embedded backend) takes and returns the types of `runtime.api`, never a dict or Any;
    every object of `runtime.api` is typed field by field."""
    import dataclasses
    import inspect
    import typing

    from sinkd.cli.backend import EmbeddedBackend
    from sinkd.daemon.rpc.client import Client
    from sinkd.daemon.runtime import api
    from sinkd.daemon.runtime.reads import SessionReads
    from sinkd.daemon.runtime.remembering import Remembering
    from sinkd.daemon.runtime.service import SinkdService
    from sinkd.daemon.runtime.turns import Turns

    wrong = []
    for cls in (SinkdService, SessionReads, Turns, Remembering, Client, EmbeddedBackend):
        for name, fn in inspect.getmembers(cls, inspect.isfunction):
            if name.startswith("_"):
                continue
            for arg, hint in typing.get_type_hints(fn).items():
                wrong += [f"{cls.__name__}.{name} {arg}: {u}" for u in _untyped(hint)]
    for name in api.__all__:
        obj = getattr(api, name)
        if dataclasses.is_dataclass(obj):
            for arg, hint in typing.get_type_hints(obj).items():
                wrong += [f"api.{name}.{arg}: {u}" for u in _untyped(hint)]
    assert not wrong, wrong
    assert _untyped(dict[str, typing.Any])  # the check itself sees what it is for


def test_protobuf_conversion_covers_every_field() -> None:
    """convert.py is written by hand against the types: a field added to a message or to its
    type without the other fails here."""
    import dataclasses

    from sinkd.daemon.runtime import api
    from sinkd.proto.v1 import sinkd_pb2 as pb

    pairs = [
        (api.Receipt, pb.Receipt),
        (api.RecallReport, pb.RecallReport),
        (api.TokenEvent, pb.Token),
        (api.Done, pb.Done),
        (api.PassageView, pb.Passage),
        (api.ModelInfo, pb.ModelInfo),
        (api.Stats, pb.StatsResponse),
        (api.Handle, pb.Handle),
        (api.DigestOptions, pb.DigestOptions),
        (api.NarratedInterval, pb.NarratedInterval),
        (api.NarratedStream, pb.NarratedStream),
    ]
    for ours, theirs in pairs:
        mine = {f.name for f in dataclasses.fields(ours)}
        wire = {f.name for f in theirs.DESCRIPTOR.fields}
        assert mine == wire, (ours.__name__, mine ^ wire)


def _documented_map() -> dict[str, set[str]]:
    """docs/development.md's layout block: each folder it names and the modules it lists there."""
    import re

    text = (ROOT / "docs" / "development.md").read_text()
    block = text.split("```\nsinkd/", 1)[1].split("```", 1)[0]
    entries: dict[str, set[str]] = {}
    parents: dict[int, str] = {}
    current = ""
    for line in ("sinkd/" + block).splitlines():
        indent = len(line) - len(line.lstrip())
        head = line.split()[0] if line.strip() else ""
        if indent < 30 and head.endswith("/") and not line.startswith("bench/"):
            parents[indent] = (parents.get(indent - 2, "") + head) if indent else head
            current = parents[indent]
            entries[current] = set()
        elif line.startswith("bench/"):
            current = ""
        if current:
            entries[current] |= set(re.findall(r"(?<![\w/])(\w+\.py)\b", line))
    return entries


def test_the_development_docs_map_is_the_tree() -> None:
    """Every folder of the package and every module in it is in the map, and nothing the map names
    is missing: the map is read by people finding their way, so it must not drift."""
    documented = _documented_map()
    actual: dict[str, set[str]] = {}
    for folder in ["sinkd", *PACKAGES]:
        for path in (ROOT / folder).rglob("*.py"):
            if "_pb2" in path.name or path.parent.name == "v1":
                continue
            rel = path.parent.relative_to(ROOT).as_posix() + "/"
            found = actual.setdefault(rel, set())
            if path.name != "__init__.py":
                found.add(path.name)
    wrong = []
    for folder, names in actual.items():
        if folder not in documented:
            wrong.append(f"{folder}: not in docs/development.md's map")
        elif documented[folder] != names:
            wrong.append(f"{folder}: missing {names - documented[folder]}, "
                         f"gone {documented[folder] - names}")  # fmt: skip
    wrong += [f"{folder}: no such folder" for folder in documented.keys() - actual.keys()]
    assert not wrong, wrong


def test_every_package_folder_is_installed() -> None:
    """A folder with an __init__.py that pyproject.toml does not list works in the editable
    install and is missing from the wheel."""
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = set()
    for folder, name in PACKAGES.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]))
    assert found - listed == set(), found - listed


def test_tests_import_their_helpers_from_support_not_from_each_other() -> None:
    """A test module imported by another runs its module fixtures' imports and ties the two
    together: what they share lives in tests/support/."""
    wrong = []
    for path in (ROOT / "tests").rglob("*.py"):
        for target in imports(path):
            if target.split(".")[0] == "tests" and not target.startswith("tests.support"):
                wrong.append(f"{path.relative_to(ROOT)} -> {target}")
    assert not wrong, wrong


MAX_CLASS_LINES = 400


def test_no_class_in_the_daemon_passes_400_lines() -> None:
    """A class that grows past this holds more than one job (the executor held the step, the
    drafts' verification and replay): give the job a part of its own."""
    long = []
    for path in sorted((ROOT / "daemon").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.name} ({lines})")
    assert not long, f"classes over {MAX_CLASS_LINES} lines: {long}"
