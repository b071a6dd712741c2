"""Samplers: llama.cpp's chain for the candidates, our own seeded draw so a restart can resume it.

Part of the engine package (it calls llama.cpp); the runtime holds samplers but never builds a chain.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

import llama_cpp as llama
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sinkd.daemon.engine.grammar import TOKEN_DATA, candidates
from sinkd.errors import EngineError, InvalidInput


def greedy_token(logits: np.ndarray) -> int:
    """The greedy token as llama.cpp's backend argmax (ggml's) picks it: the last of equal maxima
    (ggml_vec_argmax_f32), so a token computed here (after a resume, a fork, or with the backend
    argmax off) is the one the decode would have given on the CPU backend. No 49k-entry candidate
    array is filled and walked (llama.cpp's CPU greedy sampler is stateless). numpy's argmax
    finds the first; the rest of the row is searched for an equal one (an argmax over the row
    reversed runs at half the speed)."""
    first = int(np.argmax(logits))
    rest = logits[first + 1 :]
    if rest.size and rest.max() >= logits[first]:  # a tie: ggml's is the last of them
        return len(logits) - 1 - int(np.argmax(logits[::-1]))
    return first


class SamplingParams(BaseModel):
    """How a session samples; each bound is checked at construction (`validated` turns a violation
    into InvalidInput naming the field)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float = Field(default=0.0, ge=0.0, le=5.0)  # 0: greedy
    top_k: int = Field(default=40, ge=0, le=1_000_000)  # 0 disables it
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    min_p: float = Field(default=0.05, ge=0.0, lt=1.0)
    seed: int = Field(default=0, ge=0, lt=2**32)
    repeat_penalty: float = Field(default=1.0, ge=1.0, le=2.0)  # 1: off
    repeat_last_n: int = Field(default=64, ge=0, le=4096)  # over the stream's last N tokens
    chosen: bool = False  # a client chose these; False: the default, and Chat uses the model's


class Sampler:
    """A llama.cpp sampler chain for one sequence: greedy at temperature 0, else k, p, min-p, temp,
    then one draw from a seeded PCG64 stream.

    The draw is ours, not llama.cpp's `dist`, because its state must survive a restart: a sampler is
    fully described by (params, draws), and `Sampler(params, draws=n)` continues where one that had
    drawn n times stopped (each draw consumes exactly one 64-bit step of the stream).
    """

    def __init__(self, params: SamplingParams, draws: int = 0) -> None:
        self.params = params
        self.stochastic = params.temperature != 0.0
        chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
        if not chain:
            raise EngineError("llama_sampler_chain_init failed")
        self._chain = chain
        self._data: np.ndarray | None = None
        self._ids: np.ndarray | None = None
        self.draws = 0
        self._bits = np.random.PCG64(params.seed)
        self._rng = np.random.Generator(self._bits)
        if not self.stochastic:
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_top_k(params.top_k))
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_top_p(params.top_p, 1))
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_min_p(params.min_p, 1))
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_temp(params.temperature))
        self.advance(draws)

    @property
    def history_needed(self) -> int:
        """How many of the stream's last tokens `sample_logits` needs (0: no repetition penalty)."""
        return 0 if self.params.repeat_penalty == 1.0 else self.params.repeat_last_n

    def advance(self, draws: int) -> None:
        if draws < 0:
            raise InvalidInput(f"sampler draws must be >= 0, got {draws}")
        self._bits.advance(draws)
        self.draws += draws

    def sample_logits(
        self,
        logits: np.ndarray,
        recent: list[int] | None = None,
        grammar: Any = None,
        greedy: int | None = None,
    ) -> int:
        """Sample (and accept) a token from a stored next-token logits row with this chain.

        `greedy`: the row's argmax as llama.cpp computed it in the decode (Decoder's `Next`); a
        greedy sampler whose logits no penalty changed takes it without reading the row.

        `recent`: the stream's last tokens, for the repetition penalty (llama.cpp's rule: a logit
        of a token among the last N is divided by the penalty if positive, else multiplied). It is
        applied here, not by llama.cpp's penalties sampler, whose history would not survive a
        restart: the stream is durable, so a resumed session penalises exactly the same tokens."""
        penalised = self._penalised(logits, recent)
        if greedy is not None and not self.stochastic and penalised is logits:
            token = greedy
        else:
            token = self._select(penalised)
        logits = penalised
        if grammar is None:
            return token
        # a GrammarMask: as llama.cpp's common sampler does, the token chosen freely is kept if
        # the grammar allows it (one candidate checked); else every forbidden token's logit
        # becomes -inf and the choice is made again (49k candidates checked)
        if not grammar.allows(token):
            token = self._select(self._masked(logits, grammar))
        grammar.accept(token)
        return token

    def _select(self, logits: np.ndarray) -> int:
        return self.chain_select(logits) if self.stochastic else greedy_token(logits)

    def _masked(self, logits: np.ndarray, grammar: Any) -> np.ndarray:
        data = self._candidates(logits)
        grammar.mask(data, len(logits))
        if not np.isfinite(data["logit"]).any():
            raise EngineError("the output grammar allows no token here")
        return np.ascontiguousarray(data["logit"])  # a copy: the buffer is filled again to select

    def _candidates(self, logits: np.ndarray) -> np.ndarray:
        """This sampler's one candidate buffer (a 49k-row array, made once), filled from
        `logits`."""
        n = len(logits)
        if self._data is None or len(self._data) != n:
            self._data = np.zeros(n, dtype=TOKEN_DATA)
            self._ids = np.arange(n, dtype=np.int32)
        data = self._data
        data["id"] = self._ids
        data["logit"] = logits
        data["p"] = 0.0
        return data

    def chain_select(self, logits: np.ndarray) -> int:
        """The token llama.cpp's chain (and, when sampling, our seeded draw) selects."""
        n = len(logits)
        data = self._candidates(logits)
        arr = candidates(data, n)
        llama.llama_sampler_apply(self._chain, ctypes.byref(arr))
        if ctypes.cast(arr.data, ctypes.c_void_p).value != data.ctypes.data:
            raise EngineError("the sampler chain moved its candidates out of our buffer")
        if self.stochastic:
            arr.selected = self._draw(data["logit"][: arr.size])
        if not 0 <= arr.selected < arr.size:
            raise EngineError("the sampler chain selected no token")
        token = int(data["id"][arr.selected])
        llama.llama_sampler_accept(self._chain, token)
        return token

    def _penalised(self, logits: np.ndarray, recent: list[int] | None) -> np.ndarray:
        last_n = self.history_needed
        if not recent or last_n == 0:
            return logits
        p = self.params.repeat_penalty
        ids = np.unique(np.asarray(recent[-last_n:], dtype=np.int64))
        ids = ids[(ids >= 0) & (ids < len(logits))]
        out: np.ndarray = np.array(logits, copy=True)
        vals = out[ids]
        out[ids] = np.where(vals > 0, vals / p, vals * p)
        return out

    def _draw(self, logits: np.ndarray) -> int:
        """One draw from softmax(logits) over the candidates the chain kept."""
        if len(logits) == 0:
            return -1
        z = np.exp(logits.astype(np.float64) - float(np.max(logits)))
        cdf = np.cumsum(z)
        u = self._rng.random()  # exactly one step of the stream, whatever the candidates
        self.draws += 1
        return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), len(cdf) - 1))

    def reset(self) -> None:
        llama.llama_sampler_reset(self._chain)
        self._bits = np.random.PCG64(self.params.seed)
        self._rng = np.random.Generator(self._bits)
        self.draws = 0

    def close(self) -> None:
        if self._chain:
            llama.llama_sampler_free(self._chain)
            self._chain = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
