"""Embeddings as OpenAI (`/v1/embeddings`) and Ollama (`/api/embed`, the older `/api/embeddings`)
say them, over the service's `Embeddings` part: text or token ids in, recall's own vectors out,
under the tenant's call limits, in a worker thread."""

from __future__ import annotations

import base64
import time
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool

from sinkd.daemon.http.calls import Calls
from sinkd.daemon.http.error_bodies import Guarded, HttpError
from sinkd.daemon.http.wire import (
    HARMLESS,
    Unsupported,
    check_supported,
    parse_json,
    validated,
)
from sinkd.daemon.runtime.embeddings import Embedded, Embeddings
from sinkd.daemon.runtime.sessions import Principal

TokenInput = list[int] | list[list[int]]


class OpenAIBody(BaseModel):
    model_config = ConfigDict(extra="allow")  # `dimensions` refused by name, others by check

    model: str
    input: str | list[str] | TokenInput
    encoding_format: str = "float"


class EmbedBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[str]
    truncate: bool = True
    keep_alive: str | int | float | None = None
    options: dict[str, Any] | None = None


class LegacyBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    prompt: str
    keep_alive: str | int | float | None = None
    options: dict[str, Any] | None = None


Body = TypeVar("Body", OpenAIBody, EmbedBody, LegacyBody)

# fields an embedding request may carry that ask nothing of it (Ollama's: the model stays loaded)
OLLAMA_HARMLESS = frozenset({"keep_alive", "options"})
UNSUPPORTED = (
    ("dimensions", lambda v: v is None, "the embedder's own dimensions (384: no shortening)"),
)


def router(calls: Calls) -> APIRouter:
    api = APIRouter(route_class=Guarded)
    embeddings = calls.service.embeddings

    async def asked(
        request: Request, cls: type[Body], unsupported: Unsupported, harmless: frozenset[str]
    ) -> tuple[Principal, Body]:
        """Who asks, and their body, checked: every field taken or refused by name, the model
        the embedder (404 naming it otherwise)."""
        principal = calls.principal(request)
        calls.ready()
        body = validated(cls, parse_json(await calls.body(request)))
        check_supported(body, unsupported, harmless)
        embeddings.check_model(body.model)
        return principal, body

    async def computed(principal: Principal, texts: list[str], truncate: bool) -> Embedded:
        slot = await run_in_threadpool(calls.slot, principal)
        try:
            return await run_in_threadpool(embeddings.embed, texts, truncate)
        finally:
            slot.release()

    @api.post("/v1/embeddings")
    async def openai_embeddings(request: Request) -> Any:
        principal, body = await asked(request, OpenAIBody, UNSUPPORTED, HARMLESS)
        if body.encoding_format not in ("float", "base64"):
            raise HttpError(400, f"encoding_format: {body.encoding_format!r} is not float or"
                            " base64", param="encoding_format")  # fmt: skip
        texts = await run_in_threadpool(_texts, embeddings, body.input)
        done = await computed(principal, texts, truncate=False)
        data = [
            {"object": "embedding", "index": i, "embedding": _encoded(row, body.encoding_format)}
            for i, row in enumerate(done.vectors)
        ]
        usage = {"prompt_tokens": done.tokens, "total_tokens": done.tokens}
        return {"object": "list", "data": data, "model": embeddings.name, "usage": usage}

    @api.post("/api/embed")
    async def embed(request: Request) -> Any:
        principal, body = await asked(request, EmbedBody, (), OLLAMA_HARMLESS)
        started = time.perf_counter_ns()
        texts = [body.input] if isinstance(body.input, str) else body.input
        done = await computed(principal, texts, body.truncate)
        return {
            "model": body.model,
            "embeddings": done.vectors.tolist(),
            "total_duration": time.perf_counter_ns() - started,
            "load_duration": 0,
            "prompt_eval_count": done.tokens,
        }

    @api.post("/api/embeddings")
    async def legacy_embeddings(request: Request) -> Any:
        principal, body = await asked(request, LegacyBody, (), OLLAMA_HARMLESS)
        done = await computed(principal, [body.prompt], truncate=True)
        return {"embedding": done.vectors[0].tolist()}

    return api


def _texts(embeddings: Embeddings, given: str | list[str] | TokenInput) -> list[str]:
    """OpenAI's four input shapes as texts: a string, strings, one token list, token lists."""
    if isinstance(given, str):
        return [given]
    if given and all(isinstance(t, int) for t in given):
        return embeddings.texts_of([given])  # type: ignore[list-item]
    if given and all(isinstance(t, list) for t in given):
        return embeddings.texts_of(given)  # type: ignore[arg-type]
    if all(isinstance(t, str) for t in given):
        return list(given)  # type: ignore[arg-type]
    raise HttpError(400, "input: a string, strings, token ids or lists of token ids", param="input")


def _encoded(row: Any, encoding_format: str) -> Any:
    """A vector as floats, or base64 of its little-endian float32 bytes (what the openai SDK
    asks for by default, and decodes itself)."""
    if encoding_format == "base64":
        return base64.b64encode(row.astype("<f4").tobytes()).decode()
    return row.tolist()
