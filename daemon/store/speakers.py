"""Who said each stored token: the chat template's own turn headers, read as the stream evicts.

Only the template's framing carries control tokens (text from a client, a log or a document never
becomes one), so a turn header in the stream is the daemon's own and no one's words can forge it:
a token's speaker is the role its turn's header named. Tokens outside any turn (an append, a
narrated log) are `text`. The header's own tokens (the turn's opening control token, the role's
name, the line break) are framing, no one's words: they are not stored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

USER, ASSISTANT, SYSTEM, TOOL, TEXT = "user", "assistant", "system", "tool", "text"
SPEAKERS = (USER, ASSISTANT, SYSTEM, TOOL, TEXT)
UNKNOWN = "unknown"  # a passage stored before speakers were kept
# the role names chat templates write in their headers, as speakers
ROLE_NAMES = {
    "user": USER,
    "human": USER,
    "assistant": ASSISTANT,
    "model": ASSISTANT,
    "bot": ASSISTANT,
    "system": SYSTEM,
    "developer": SYSTEM,
    "tool": TOOL,
    "ipython": TOOL,
    "function": TOOL,
}
MAX_ROLE_CHARS = 32  # a header's role name is a word; past this the "header" was not one


def speaker_of_role(role: str) -> str:
    return ROLE_NAMES.get(role.strip().lower(), TEXT)


@dataclass(frozen=True)
class TurnMarks:
    """The control tokens that open a turn (the role's name follows them), read off the
    template's rendering of a user turn. None: the model has no chat template (all is text)."""

    opens: frozenset[int]

    @classmethod
    def of(
        cls,
        header: Sequence[int],
        is_control: Callable[[int], bool],
        piece: Callable[[int], bytes],
    ) -> TurnMarks:
        """`header`: a user turn's tokens before its content (the template's framing); the
        opener is the control token right before the role's name."""
        last: int | None = None
        after = b""
        for tok in header:
            if is_control(tok):
                last, after = tok, b""
                continue
            after += piece(tok)
            if last is not None and b"user" in after.lower():
                return cls(frozenset((last,)))
        return cls(frozenset())


@dataclass(frozen=True)
class Turns:
    """What reading a stream's turns takes from its model: the openers and its control tokens."""

    marks: TurnMarks
    is_control: Callable[[int], bool]


NO_TURNS = Turns(TurnMarks(frozenset()), lambda _: False)  # no chat template: all is text


@dataclass
class SpeakerState:
    """Where the reading stands after the last stored token: the current turn's speaker and
    number, and a header being read (its role's text so far), cut by the end of an eviction."""

    speaker: str = TEXT
    turn: int = 0
    header: str | None = None


def label(
    tokens: Sequence[int],
    state: SpeakerState,
    marks: TurnMarks,
    piece: Callable[[int], bytes],
    is_control: Callable[[int], bool],
) -> list[tuple[str, int] | None]:
    """(speaker, turn) of each token, in order, None for a turn header's own tokens (framing,
    not anyone's words: they are not stored); `state` is advanced past them, a header cut by the
    end of `tokens` included, so any cut of a stream reads the same."""
    out: list[tuple[str, int] | None] = []
    for tok in tokens:
        if tok in marks.opens:
            state.turn += 1
            state.header = ""
            out.append(None)
        elif state.header is not None:
            control = is_control(tok)
            text = "" if control else piece(tok).decode("utf-8", errors="ignore")
            role, newline, _ = text.partition("\n")
            state.header += role
            out.append(None)
            if newline or control or len(state.header) > MAX_ROLE_CHARS:
                state.speaker = speaker_of_role(state.header)
                state.header = None
        else:
            out.append((state.speaker, state.turn))
    return out
