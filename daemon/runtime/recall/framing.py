"""How a recalled passage is put before the model in a chat: a system turn of its own, said to be
recalled (the header says it may be incomplete: recall brings text back, not the model's state)."""

from __future__ import annotations

from sinkd.daemon.engine.llama import Engine

RECALL_HEADER = "Recalled from earlier in this conversation (it may be incomplete):\n"


def chat_frame(engine: Engine) -> tuple[str, str]:
    """The text before and after a passage. The template is rendered around a marker and cut
    there. The marker is printable: llama.cpp takes the content as a C string, so a NUL would end
    it (and the passage would land after the turn's end, outside the system turn, as a first
    version did)."""
    mark = "@@sinkd-recalled-passage@@"
    turn = engine.vocab.render_chat([("system", RECALL_HEADER + mark)], add_assistant=False)
    head, found, tail = turn.partition(mark)
    if not found:  # a template that rewrites content: the passage follows a turn of its own
        return (turn, "")
    return (head, tail)
