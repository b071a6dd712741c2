"""Sentence vectors for clients (`/v1/embeddings`, Ollama's `/api/embed`): the embedder recall runs
all day, so a RAG client needs no second server, and its vectors are recall's own (the same model,
weights and normalisation; the same object).

Computed in the caller's worker thread, never the engine thread, one request at a time (numpy's
BLAS runs on one thread: two requests at once would take both cores from llama.cpp), at most
MAX_INPUTS texts a request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from sinkd.daemon.models.registry import ModelLock, model_path
from sinkd.daemon.models.token_ids import TokenIds, load
from sinkd.daemon.store.embedder import DIM, MAX_TOKENS, Embedder
from sinkd.errors import InvalidInput, ModelMissing, NotFound

MAX_INPUTS = 256  # texts a request embeds (OpenAI takes 2,048; the embedder sub-batches them)


@dataclass(frozen=True)
class Embedded:
    vectors: np.ndarray  # (n, dim) float32, unit rows
    tokens: int  # what the embedder read, its marks included


class Embeddings:
    """The embedder as a service part: named, checked input, one computation at a time."""

    def __init__(
        self,
        lock: ModelLock,
        embedder: Callable[[], Embedder | None],
        why_not: Callable[[], str],
    ) -> None:
        self._embedder = embedder
        self._why_not = why_not
        self._one_at_a_time = threading.Lock()
        entry = lock.default_embedder()
        self.name = entry.name if entry is not None else ""
        self.size = entry.size if entry is not None else 0
        self.sha256 = entry.sha256 if entry is not None else ""
        self._vocabulary = lock.token_vocabulary()
        self.dimensions, self.max_tokens = DIM, MAX_TOKENS

    def check_model(self, asked: str) -> None:
        """NotFound naming the embedder served here, for a model that is not it."""
        if not self.name:
            raise NotFound("no embedder is served here (models.lock names none)")
        if asked not in (self.name, f"{self.name}:latest"):
            raise NotFound(f"embedding model {asked!r} is not served here ({self.name} is)")

    def texts_of(self, token_lists: Sequence[Sequence[int]]) -> list[str]:
        """Token-id input (cl100k_base, as LangChain's OpenAIEmbeddings sends) as its text."""
        ids = self._token_ids()
        return [ids.text(list(t), f"input[{i}]") for i, t in enumerate(token_lists)]

    def embed(self, texts: Sequence[str], truncate: bool) -> Embedded:
        """Unit vectors of `texts`. A text longer than the embedder reads (MAX_TOKENS) is refused
        naming it, unless `truncate` (then its first MAX_TOKENS are read, and counted)."""
        if not texts:
            raise InvalidInput("input: at least one text", field="input")
        if len(texts) > MAX_INPUTS:
            raise InvalidInput(f"input: at most {MAX_INPUTS} texts a request", field="input")
        embedder = self._embedder()
        if embedder is None:
            raise ModelMissing(f"the embedder is not loaded: {self._why_not()}")
        with self._one_at_a_time:
            reads = embedder.read(list(texts))  # once: checked, then embedded
            long = [i for i, r in enumerate(reads) if r.cut]
            if long and not truncate:
                raise InvalidInput(
                    f"input[{long[0]}]: longer than the {MAX_TOKENS} tokens {self.name} reads"
                    f" ({len(long)} such texts); send shorter texts",
                    field="input",
                )
            vectors = embedder.vectors(reads)
        return Embedded(vectors, sum(len(r.ids) for r in reads))

    def _token_ids(self) -> TokenIds:
        entry = self._vocabulary
        if entry is None:
            raise InvalidInput(
                "input: token ids are not taken here (models.lock names no vocabulary)"
            )
        path = model_path(entry)
        if not path.is_file():
            raise ModelMissing(
                f"token-id input needs {entry.name}: `sinkd models pull {entry.name}` (or send text)"
            )
        return load(path)
