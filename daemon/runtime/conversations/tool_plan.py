"""How a chat turn's tools are offered: described after the system prompt and pinned with it,
the reply decoded in the generic tool format (`tool_format`), when they fit what a session pins;
otherwise answered without them (tool_choice auto or none), said in the answer, or refused naming
`tools` and the counts. Shared by both HTTP conversation layers (stateless chats, responses)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.runtime import requests
from sinkd.daemon.runtime.api import (
    ChatDone,
    ChatStream,
    GenerationOptions,
    OutputFormat,
    Stream,
    TokenEvent,
    ToolUse,
    Turn,
)
from sinkd.daemon.runtime.conversations import tool_format
from sinkd.daemon.runtime.conversations.tool_format import ReplyReader
from sinkd.errors import InvalidInput, message_of


@dataclass(frozen=True)
class ToolsReport:
    """What became of a turn's tools: `pinned` (described after the system prompt and pinned with
    it, the reply decoded in the generic tool format) or left out because the description and
    the system prompt (`tokens`) are more than a session here pins (`bound`): said, never silent."""

    offered: int
    pinned: bool
    tokens: int
    bound: int

    @property
    def note(self) -> str:
        if self.pinned:
            return f"{self.offered} tools pinned with the system prompt ({self.tokens} tokens)"
        return (
            f"{self.offered} tools not offered to the model: with the system prompt they are"
            f" {self.tokens} tokens, and a session here pins at most {self.bound}; answered"
            " without tools"
        )


@dataclass(frozen=True)
class ToolPlan:
    """A turn as its session takes it: the system prompt (with the tools' descriptions when they
    are offered), the turns as text, the options (the reply's grammar), and what became of the
    tools."""

    system: str
    turns: tuple[Turn, ...]
    options: GenerationOptions
    report: ToolsReport | None
    answer_is_text: bool = True  # else a response format shapes the answer as JSON

    @property
    def active(self) -> bool:
        return self.report is not None and self.report.pinned

    def reading(self, events: Stream) -> ChatStream:
        """The turn's events as the client reads them: through the tool format's reader when
        the tools were offered."""
        return tool_events(events, ReplyReader(self.answer_is_text)) if self.active else events


def plan(
    system: str,
    turns: tuple[Turn, ...],
    options: GenerationOptions,
    use: ToolUse | None,
    engine: Engine,
    bound: int,
) -> ToolPlan:
    """InvalidInput naming the tool and keyword a schema asks that the grammar cannot enforce, or
    `tools` when they do not fit and the choice needs them."""
    if use is None:
        return ToolPlan(system, tool_format.render(turns, False), options, None)
    tool_format.check_use(use)
    described = tool_format.tools_prompt(system, use.tools)
    tokens = len(requests.system_tokens(engine, described))
    report = ToolsReport(len(use.tools), tokens <= bound, tokens, bound)
    if not report.pinned:
        if use.choice not in ("auto", "none"):
            raise InvalidInput(
                f"tools: the {report.offered} tools' descriptions with the system prompt are"
                f" {tokens} tokens; a session here pins at most {bound}, and tool_choice"
                f" {use.choice!r} needs them"
            )
        return ToolPlan(system, tool_format.render(turns, False), options, report)
    for i, tool in enumerate(use.tools):  # only tools offered to the model need a grammar
        try:
            one = tool_format.reply_schema(ToolUse((tool,), tool.name), None)
            requests.output_grammar(OutputFormat(json.dumps(one)))
        except InvalidInput as e:
            raise type(e)(f"tools[{i}] ({tool.name}) parameters: {message_of(e)}") from None
    schema = tool_format.reply_schema(use, options.output)
    constrained = dataclasses.replace(options, output=OutputFormat(json.dumps(schema)))
    turns = tool_format.render(turns, True)
    return ToolPlan(described, turns, constrained, report, options.output is None)


def tool_events(events: Stream, reader: ReplyReader) -> ChatStream:
    """A reply in the generic tool format as the client reads it: the answer's text, the calls'
    pieces as they come, and the calls made whole on its end (`ChatDone`)."""
    for event in events:
        if isinstance(event, TokenEvent):
            text, deltas = reader.feed(event.text)
            if text:
                yield dataclasses.replace(event, text=text)
            yield from deltas
        else:
            yield ChatDone(**vars(event), calls=reader.calls())
