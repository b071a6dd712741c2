"""Token ids a client sends for text, read back to that text: OpenAI's cl100k_base, which
LangChain's OpenAIEmbeddings (and others built on tiktoken) send to `/v1/embeddings` by default.
The embedder reads text with its own tokenizer, so the ids are only a wire form of the text.

The ranks file is pinned in models.lock (`[vocabularies]`) and pulled like a model; it is read once,
on the first call that sends ids. Files only: no tiktoken (its loader fetches from the network).
"""

from __future__ import annotations

import base64
import gzip
import threading
from pathlib import Path

from sinkd.errors import InvalidInput

# cl100k_base's special tokens (tiktoken_ext/openai_public.py): a client's text never holds them
SPECIAL = {
    100257: b"<|endoftext|>",
    100258: b"<|fim_prefix|>",
    100259: b"<|fim_middle|>",
    100260: b"<|fim_suffix|>",
    100276: b"<|endofprompt|>",
}


class TokenIds:
    """One vocabulary's ranks: id -> the bytes it stands for."""

    def __init__(self, path: Path) -> None:
        pieces: dict[int, bytes] = {}
        with gzip.open(path, "rt", encoding="ascii") as lines:
            for line in lines:
                if line.strip():
                    text, rank = line.split()
                    pieces[int(rank)] = base64.b64decode(text)
        self._pieces = [pieces[i] for i in range(len(pieces))]  # ranks 0..n-1, each once
        self.name = path.name

    def text(self, ids: list[int], where: str) -> str:
        """The text the ids spell (InvalidInput naming `where` for an id out of the vocabulary,
        a special token, or bytes that are not UTF-8)."""
        out = bytearray()
        for i in ids:
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(self._pieces):
                hint = " (a special token: not text)" if i in SPECIAL else ""
                raise InvalidInput(f"{where}: token id {i!r} is not in cl100k_base{hint}")
            out += self._pieces[i]
        try:
            return out.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(f"{where}: the token ids do not spell UTF-8 text") from None


_loaded: dict[Path, TokenIds] = {}
_lock = threading.Lock()


def load(path: Path) -> TokenIds:
    """Once per file and process."""
    with _lock:
        if path not in _loaded:
            _loaded[path] = TokenIds(path)
        return _loaded[path]
