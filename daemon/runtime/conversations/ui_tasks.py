"""A chat UI's own side tasks, answered in the form they ask for. Open WebUI asks the model, after
a chat's replies, for a title, tags and follow-up suggestions: one user message holding its task
prompt, which says the answer must be one JSON object of a given shape, but sends no
`response_format`. A small model often answers in prose, and the UI then keeps the first message
as the title and shows no suggestions.

Where the message is one of Open WebUI's default task prompts (told by their fixed text, never
stored), the reply is decoded under the grammar of the object the prompt itself describes, as if
the client had sent that `response_format`. It is announced on every answer
(`x-sinkd-output`) and turned off by `ui_task_grammar = false`. A customised prompt, or any other
client, is not touched. Pure: text in, a format out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sinkd.daemon.runtime.api import OutputFormat, Turn


def _strings(most: int, fewest: int, chars: int) -> dict[str, object]:
    return {
        "type": "array",
        "items": {"type": "string", "minLength": 1, "maxLength": chars},
        "minItems": fewest,
        "maxItems": most,
    }


def _object(key: str, value: dict[str, object]) -> str:
    schema = {
        "type": "object",
        "properties": {key: value},
        "required": [key],
        "additionalProperties": False,
    }
    return json.dumps(schema, sort_keys=True)


@dataclass(frozen=True)
class UiTask:
    name: str
    opening: str  # the task prompt's first lines (Open WebUI 0.12.4's config.py)
    shape: str  # its "### Output" line: the object it asks for
    schema_json: str  # that object as a schema, bounded (a small model may not stop a string)


TASKS = (
    UiTask(
        "open-webui title",
        "### Task:\nGenerate a concise title summarizing the chat history.",
        'JSON format: { "title": "your concise title here" }',
        _object("title", {"type": "string", "minLength": 1, "maxLength": 60}),
    ),
    UiTask(
        "open-webui tags",
        "### Task:\nGenerate 1-3 broad tags categorizing the main themes of the chat history",
        'JSON format: { "tags": ["tag1", "tag2", "tag3"] }',
        _object("tags", _strings(6, 1, 32)),
    ),
    UiTask(
        "open-webui follow-ups",
        "### Task:\nPredict 3-5 useful messages this user might naturally send next",
        'JSON format: { "follow_ups": ["Suggested next message 1", "Suggested next message 2",'
        ' "Suggested next message 3"] }',
        _object("follow_ups", _strings(3, 1, 120)),
    ),
)


@dataclass(frozen=True)
class Recognized:
    output: OutputFormat
    note: str  # what an answer says of it (`x-sinkd-output`)


def recognized(turns: tuple[Turn, ...]) -> Recognized | None:
    """The format a UI's task message asks for, where it is one of the known task prompts."""
    if len(turns) != 1 or turns[0].role != "user":
        return None
    text = turns[0].content
    for task in TASKS:
        if text.startswith(task.opening) and task.shape in text:
            note = (
                f"{task.name}: the prompt asks for one JSON object ({task.shape.split(': ')[1]});"
                " decoded under its grammar (ui_task_grammar)"
            )
            return Recognized(OutputFormat(task.schema_json), note)
    return None
