"""Find a model's GGUF in an Ollama store, as Ollama lays it out, and check it is the blob named.

    $OLLAMA_MODELS (else ~/.ollama/models)/
        manifests/registry.ollama.ai/library/NAME/TAG   JSON: layers, one of them the model
        blobs/sha256-HEX                                the GGUF, named by its digest

Nothing is copied: the user entry records the blob's path and hash.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from sinkd.daemon.models.registry import sha256_file
from sinkd.errors import InvalidInput, ModelMismatch, ModelMissing

MODEL_LAYER = "application/vnd.ollama.image.model"
DEFAULT_HOST = "registry.ollama.ai"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class OllamaModel:
    reference: str  # NAME:TAG as asked, tag filled in
    blob: Path
    sha256: str

    @property
    def entry_name(self) -> str:
        """A lock name for it: the model and tag, lower case, without the registry path."""
        name, _, tag = self.reference.rpartition(":")
        base = name.rsplit("/", 1)[-1]
        return f"{base}-{tag}".lower()


def store_root() -> Path:
    env = os.environ.get("OLLAMA_MODELS")
    return Path(env) if env else Path.home() / ".ollama" / "models"


def manifest_path(root: Path, reference: str) -> tuple[Path, str]:
    """NAME[:TAG], NAMESPACE/NAME[:TAG] or HOST/NAMESPACE/NAME[:TAG] -> its manifest file."""
    name, sep, tag = reference.partition(":")
    tag = tag if sep else "latest"
    parts = name.split("/")
    if len(parts) == 1:
        parts = [DEFAULT_HOST, "library", *parts]
    elif len(parts) == 2:
        parts = [DEFAULT_HOST, *parts]
    if len(parts) != 3 or not all(_NAME.match(p) for p in [*parts, tag]):
        raise InvalidInput(f"{reference!r} is not an Ollama model name (NAME[:TAG])")
    return root.joinpath("manifests", *parts, tag), f"{name}:{tag}"


def find(reference: str, root: Path | None = None) -> OllamaModel:
    """The GGUF blob of `reference`, its digest verified (ModelMismatch when the bytes differ)."""
    root = root or store_root()
    manifest, full = manifest_path(root, reference)
    if not manifest.is_file():
        raise ModelMissing(
            f"no Ollama model {full} in {root} (ollama pull it, or set OLLAMA_MODELS)"
        )
    try:
        layers = json.loads(manifest.read_text()).get("layers", [])
        digest = next(x["digest"] for x in layers if x.get("mediaType") == MODEL_LAYER)
    except (json.JSONDecodeError, AttributeError, KeyError, StopIteration, TypeError):
        raise InvalidInput(f"{manifest} is not an Ollama manifest with a model layer") from None
    algo, _, hexdigest = str(digest).partition(":")
    if algo != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hexdigest):
        raise InvalidInput(f"{manifest}: unsupported digest {digest!r}")
    blob = root / "blobs" / f"sha256-{hexdigest}"
    if not blob.is_file():
        raise ModelMissing(f"{full}: its blob {blob.name} is missing from {root / 'blobs'}")
    actual = sha256_file(blob)
    if actual != hexdigest:
        raise ModelMismatch(full, "sha256", hexdigest, actual, "its Ollama manifest")
    return OllamaModel(full, blob, hexdigest)
