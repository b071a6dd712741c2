"""How recalled passages are put before the model in a chat turn. Four presentations, measured per
model on the chat arm of the evaluation (`python bench/recall_chat.py`, `sinkd eval recall --arm chat
--presentation`; the choice is the model's `recall_presentation` in models.lock):

- `system-after`: a system turn of its own between the user's turn and the answer;
- `system-before`: that system turn before the user's turn;
- `quoted`: inside the user's turn, before the question, as quoted earlier conversation;
- `user-turn`: as an earlier user turn of its own before the question (the transcript's form).

Every frame says the text is recalled and may be incomplete (recall brings text back, not the
model's state). Only the template's own framing carries control tokens; the passage is text.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sinkd.daemon.engine.llama import Engine
from sinkd.errors import InvalidInput

RECALL_HEADER = "Recalled from earlier in this conversation (it may be incomplete):\n"
QUOTE_HEAD = 'Earlier in this conversation (recalled, it may be incomplete): "'
QUOTE_TAIL = '"\n\n'


class Presentation(str, enum.Enum):
    SYSTEM_AFTER = "system-after"
    SYSTEM_BEFORE = "system-before"
    QUOTED = "quoted"
    USER_TURN = "user-turn"

    @classmethod
    def named(cls, name: str) -> Presentation:
        try:
            return cls(name)
        except ValueError:
            known = ", ".join(p.value for p in cls)
            raise InvalidInput(
                f"recall presentation {name[:64]!r} is unknown (known: {known})"
            ) from None


@dataclass(frozen=True)
class ChatLayout:
    """The text before and after each passage, and where in the turn's tokens they go."""

    frame: tuple[str, str]
    insert_at: int


def _cut(turn: str, mark: str) -> tuple[str, str]:
    head, found, tail = turn.partition(mark)
    return (head, tail) if found else (turn, "")


def chat_frame(engine: Engine) -> tuple[str, str]:
    """A system turn around the passage. The template is rendered around a marker and cut there.
    The marker is printable: llama.cpp takes the content as a C string, so a NUL would end it (and
    the passage would land after the turn's end, outside the system turn, as a first version
    did). A template that rewrites content: the passage follows a turn of its own."""
    mark = "@@sinkd-recalled-passage@@"
    return _cut(
        engine.vocab.render_chat([("system", RECALL_HEADER + mark)], add_assistant=False), mark
    )


def chat_layout(
    engine: Engine,
    presentation: Presentation,
    prefix: str,
    turn: str,
    mark: str,
    question_tokens: int,
) -> ChatLayout:
    """`turn`: the user's turn as the template renders it, `mark` where the message goes;
    `prefix`: the text before it (a newline after an earlier reply); `question_tokens`: the
    prefix and turn as tokens. Frames are tokenized on their own, as the turn's parts are."""
    if presentation is Presentation.SYSTEM_AFTER:
        return ChatLayout(chat_frame(engine), question_tokens)
    before_turn = len(engine.vocab.tokenize_framed(prefix, [])) if prefix else 0
    if presentation is Presentation.SYSTEM_BEFORE:
        return ChatLayout(chat_frame(engine), before_turn)
    if presentation is Presentation.USER_TURN:
        head, tail = _cut(turn, mark)
        return ChatLayout((head + RECALL_HEADER, tail), before_turn)
    head, _ = _cut(turn, mark)
    return ChatLayout(
        (QUOTE_HEAD, QUOTE_TAIL), len(engine.vocab.tokenize_framed(prefix + head, []))
    )
