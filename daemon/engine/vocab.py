"""The vocabulary: tokens to text and back, the chat template, the tokenizer's hash.

The engine's `vocab` member, and the only part other threads may call (a request's text is tokenized on its
RPC thread, not the engine's). llama.cpp's vocabulary is read-only once loaded; what must not happen
is a call while the engine frees the model, so each call holds a share of a guard that `close` takes
whole: close waits for calls in progress, and a call after it raises ShuttingDown.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import llama_cpp as llama

from sinkd.daemon import failpoints
from sinkd.daemon.engine.grammar import GrammarMask
from sinkd.errors import EngineError, InvalidInput, ShuttingDown, Unsupported


def content_mark(i: int) -> str:
    """Stands in for message i's content when a template is rendered (printable: llama.cpp takes
    the content as a C string); the rendering is cut there (`tokenize_framed`)."""
    return f"@@sinkd-content-{i}@@"


class Vocabulary:
    """The loaded model's vocabulary (`llama_model_get_vocab`); `chat_template` is the engine's
    choice (the file's own, or a built-in one the model's entry names)."""

    def __init__(self, vocab: Any) -> None:
        self._vocab = vocab
        self.n_vocab = int(llama.llama_vocab_n_tokens(vocab))
        self.adds_bos = bool(llama.llama_vocab_get_add_bos(vocab))
        self.bos = int(llama.llama_vocab_bos(vocab))
        self.chat_template = ""
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._text_cond = threading.Condition()
        self._text_users = 0
        self._text_closed = False
        self.sha256 = self._tokenizer_hash()
        fim = (llama.llama_vocab_fim_pre, llama.llama_vocab_fim_suf, llama.llama_vocab_fim_mid)
        ids = tuple(int(f(vocab)) for f in fim)
        self._fim = ids if min(ids) >= 0 else None

    def fim_tokens(self) -> tuple[int, ...] | None:
        """The fill-in-the-middle tokens (prefix, suffix, middle) llama.cpp finds, or None."""
        return self._fim

    def close(self) -> None:
        """Wait for the calls in progress; any later call raises ShuttingDown."""
        with self._text_cond:
            self._text_closed = True
            self._text_cond.notify_all()
            while self._text_users:
                self._text_cond.wait()

    @contextlib.contextmanager
    def _text_use(self) -> Iterator[None]:
        with self._text_cond:
            if self._text_closed:
                raise ShuttingDown("the daemon is shutting down")
            self._text_users += 1
        try:
            yield
        finally:
            with self._text_cond:
                self._text_users -= 1
                self._text_cond.notify_all()

    def _tokenizer_hash(self) -> str:
        h = hashlib.sha256()
        for tok in range(self.n_vocab):
            h.update(llama.llama_vocab_get_text(self._vocab, tok) or b"")
            h.update(
                b"\0%d\0%r\n"
                % (
                    llama.llama_vocab_get_attr(self._vocab, tok),
                    llama.llama_vocab_get_score(self._vocab, tok),
                )
            )
        return h.hexdigest()

    def check_tokens(self, tokens: list[int]) -> None:
        n_vocab = self.n_vocab
        for tok in tokens:  # a plain loop: every decode step checks its tokens
            if not 0 <= tok < n_vocab:
                raise InvalidInput(f"token id {tok} is outside the vocabulary (0..{n_vocab - 1})")

    def constrain(self, grammar: str) -> GrammarMask:
        """A reply's grammar state over this vocabulary (structured output)."""
        return GrammarMask(self._vocab, grammar)

    def tokenize(self, text: str, add_bos: bool = False, special: bool = False) -> list[int]:
        """Tokenize as text: a control token's spelling in `text` ("<|im_start|>") stays text.
        `special` parses such spellings as control tokens: for the chat template's own framing
        alone (`tokenize_framed`), never for what a client, a log or a document says.
        BOS only when asked and the model adds one."""
        with self._text_use():
            failpoints.hit("tokenize")
            return self._tokenize(text, add_bos, special)

    def tokenize_framed(
        self, framed: str, contents: Sequence[str | list[int]], add_bos: bool = False
    ) -> list[int]:
        """A template's rendering with `content_mark(i)` where content i goes: the framing with
        its control tokens, each content as text (it cannot open a turn of its own). A content
        given as token ids is one tokenized already, as text (`tokenize`): one text framed two
        ways is tokenized once."""
        out: list[int] = []
        rest = framed
        for i, content in enumerate(contents):
            head, found, rest = rest.partition(content_mark(i))
            if not found:
                raise Unsupported(
                    "this model's chat template rewrites message content; send token ids instead"
                )
            out += self.tokenize(head, add_bos=add_bos and not out, special=True)
            out += self.tokenize(content) if isinstance(content, str) else content
        out += self.tokenize(rest, add_bos=add_bos and not out, special=True)
        return out

    def _tokenize(self, text: str, add_bos: bool, special: bool) -> list[int]:
        data = text.encode("utf-8", errors="replace")
        cap = len(data) + 8
        buf = (llama.llama_token * cap)()
        bos = add_bos and self.adds_bos
        n = llama.llama_tokenize(self._vocab, data, len(data), buf, cap, bos, special)
        if n < 0:
            cap = -n
            buf = (llama.llama_token * cap)()
            n = llama.llama_tokenize(self._vocab, data, len(data), buf, cap, bos, special)
        if n < 0:
            raise EngineError("tokenization failed")
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The token's bytes; remembered, so a generated token costs no call into llama.cpp."""
        known = self._pieces.get(token)
        if known is None:
            known = self._pieces[token] = self._piece(token)
        return known

    def _piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
        return buf.raw[: max(n, 0)]

    def detokenize(self, tokens: list[int]) -> str:
        with self._text_use():
            return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def render_chat(self, messages: list[tuple[str, str]], add_assistant: bool) -> str:
        """Frame messages with the model's own chat template (llama.cpp's built-in renderer)."""
        if not self.chat_template:
            raise Unsupported("this model has no chat template")
        with self._text_use():
            return self._render_chat(messages, add_assistant)

    def _render_chat(self, messages: list[tuple[str, str]], add_assistant: bool) -> str:
        keep = [(role.encode(), text.encode("utf-8", errors="replace")) for role, text in messages]
        chat = (llama.llama_chat_message * len(keep))(
            *(llama.llama_chat_message(role=r, content=c) for r, c in keep)
        )
        template = self.chat_template.encode()
        size = sum(len(c) for _, c in keep) * 2 + 256
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = llama.llama_chat_apply_template(template, chat, len(keep), add_assistant, buf, size)
            if n < 0:
                raise Unsupported("llama.cpp does not recognise this model's chat template")
            if n <= size:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = n
        raise EngineError("chat template rendering did not converge")

    def is_eog(self, token: int) -> bool:
        known = self._eog.get(token)
        if known is None:
            known = self._eog[token] = bool(llama.llama_vocab_is_eog(self._vocab, token))
        return known

    def is_control(self, token: int) -> bool:
        """A control token (a chat template's turn markers, BOS, EOS): structure, not text."""
        return bool(llama.llama_vocab_is_control(self._vocab, token))
