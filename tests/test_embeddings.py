"""Embeddings over the HTTP front, with the real clients: the openai SDK (float and its default
base64), LangChain's OpenAIEmbeddings with its defaults (cl100k token ids on the wire), the ollama
client's `embed` and older `embeddings`. Each gets recall's own vectors for the same text."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import ollama
import openai
import pytest

from sinkd.daemon.models.registry import load_lock, model_path
from sinkd.daemon.node import Daemon
from tests.support.daemons import http_daemon, openai_client

pytestmark = pytest.mark.model
EMBEDDER = "minilm-l6-v2"
TEXTS = [
    "My name is Ada and I keep bees.",
    "The meeting moved to Thursday at noon.",
    "naïve café ☕",
]
CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = http_daemon(tmp_path_factory.mktemp("embeddings"))
    yield d
    d.stop()


def recall_vectors(daemon: Daemon, texts: list[str]) -> np.ndarray:
    embedder = daemon.service.embedder
    assert embedder is not None
    return embedder.embed(texts)


def assert_same(got: Any, want: np.ndarray) -> None:
    got = np.asarray(got, np.float32)
    assert got.shape == want.shape
    cosines = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosines.min() > 0.999, cosines


def test_the_openai_sdk_gets_recalls_vectors(daemon: Daemon) -> None:
    client: openai.OpenAI = openai_client(daemon)
    want = recall_vectors(daemon, TEXTS)
    floats = client.embeddings.create(model=EMBEDDER, input=TEXTS, encoding_format="float")
    assert_same([d.embedding for d in floats.data], want)
    default = client.embeddings.create(model=EMBEDDER, input=TEXTS[0])  # the SDK asks base64
    assert_same([default.data[0].embedding], want[:1])
    assert floats.model == EMBEDDER and floats.usage.prompt_tokens > len(TEXTS) * 2
    assert EMBEDDER in [m.id for m in client.models.list()]


def test_langchain_openai_embeddings_with_its_defaults(daemon: Daemon, tmp_path: Path) -> None:
    """LangChain tokenizes with tiktoken's cl100k_base and sends the ids; tiktoken's file comes
    from the pinned vocabulary here (its loader would fetch it from the network)."""
    from langchain_openai import OpenAIEmbeddings

    vocabulary = load_lock().token_vocabulary()
    assert vocabulary is not None
    cache = tmp_path / "tiktoken"
    cache.mkdir()
    key = hashlib.sha1(CL100K_URL.encode()).hexdigest()
    (cache / key).write_bytes(gzip.decompress(model_path(vocabulary).read_bytes()))
    sent: list[Any] = []

    def seen(request: httpx.Request) -> None:
        sent.append(json.loads(request.content)["input"])

    assert daemon.http is not None
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", str(cache))
        embeddings = OpenAIEmbeddings(
            model=EMBEDDER, base_url=f"{daemon.http.address}/v1", api_key="alice-token",  # type: ignore[arg-type]
            http_client=httpx.Client(event_hooks={"request": [seen]}),
        )  # fmt: skip
        documents = embeddings.embed_documents(TEXTS)
        query = embeddings.embed_query(TEXTS[1])
    assert sent and all(isinstance(t, list) and isinstance(t[0], int) for t in sent[0])
    want = recall_vectors(daemon, TEXTS)
    assert_same(documents, want)
    assert_same([query], want[1:2])


def test_the_ollama_client_embeds(daemon: Daemon) -> None:
    assert daemon.http is not None
    client = ollama.Client(
        host=daemon.http.address, headers={"authorization": "Bearer alice-token"}
    )
    want = recall_vectors(daemon, TEXTS)
    assert_same(client.embed(model=EMBEDDER, input=TEXTS).embeddings, want)
    assert_same([client.embeddings(model=EMBEDDER, prompt=TEXTS[2]).embedding], want[2:])
    assert EMBEDDER in [m.model for m in client.list().models]


def test_what_the_embedder_cannot_do_is_refused_by_name(daemon: Daemon) -> None:
    client: openai.OpenAI = openai_client(daemon)
    with pytest.raises(openai.NotFoundError, match=f"{EMBEDDER} is"):
        client.embeddings.create(model="text-embedding-3-small", input="hi")
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model=EMBEDDER, input="hi", dimensions=128)
    long = "bees " * 400
    with pytest.raises(openai.BadRequestError, match=r"input\[1\]: longer than the 256 tokens"):
        client.embeddings.create(model=EMBEDDER, input=["short", long])
    with pytest.raises(openai.BadRequestError, match="token id 100257"):
        client.embeddings.create(model=EMBEDDER, input=[[15339, 100257]])
    assert daemon.http is not None
    ollama_client = ollama.Client(
        host=daemon.http.address, headers={"authorization": "Bearer alice-token"}
    )
    assert len(ollama_client.embed(model=EMBEDDER, input=long).embeddings) == 1  # Ollama truncates
    with pytest.raises(ollama.ResponseError) as err:
        ollama_client.embed(model=EMBEDDER, input=long, truncate=False)
    assert err.value.status_code == 400 and "longer than" in str(err.value)
    with pytest.raises(ollama.ResponseError) as err:
        ollama_client.embed(model="nomic-embed-text", input="hi")
    assert err.value.status_code == 404 and EMBEDDER in str(err.value)
