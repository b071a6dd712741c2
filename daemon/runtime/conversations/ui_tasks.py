"""A chat UI's own side tasks, answered in the form they ask for. Open WebUI asks the model, after
a chat's replies, for a title, tags and follow-up suggestions: one user message holding its task
prompt, which says the answer must be one JSON object of a given shape, but sends no
`response_format`. A small model often answers in prose, and the UI then keeps the first message
as the title and shows no suggestions.

Where the message is one of Open WebUI's default task prompts (told by their fixed text, never
stored), the reply is decoded under the grammar of the object the prompt itself describes, as if
the client had sent that `response_format`, and no value of it may begin as the prompt's own
placeholders do ("Your concise title...", "Suggested next message 12", "tag4") or be one of its
example answers ("Stock Trends,"), in the forms a small model copies them: the grammar has no way
into them. It is announced on every answer
(`x-sinkd-output`) and turned off by `ui_task_grammar = false`. A customised prompt, or any other
client, is not touched. Pure: text in, a format out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from sinkd.daemon.runtime.api import OutputFormat, Turn

TAILS = (".", ",", "!", "?", ";", ":", " ")


def _forms(text: str) -> list[str]:
    """As a small model copies a text: as written, lower case, its first letter in capitals (the
    rest as written, or in lower case), every word's, all in capitals; after a space or not."""
    forms = (
        text, text.lower(), text[:1].upper() + text[1:], text.capitalize(), text.title(),
        text.upper(),
    )  # fmt: skip
    return list(dict.fromkeys(head + f for f in forms for head in ("", " ")))


def copies(examples: tuple[str, ...]) -> list[str]:
    """A prompt's example answers as a small model copies them (`_forms`), bare or with up to
    two stops, commas, marks or spaces after, or "..." ("Stock Trends,", " Remote Work?")."""
    tails = ["", "...", *TAILS, *(a + b for a in TAILS for b in TAILS)]
    return list(dict.fromkeys(f + tail for e in examples for f in _forms(e) for tail in tails))


def _string(
    chars: int, stems: tuple[str, ...], examples: tuple[str, ...] = ()
) -> dict[str, object]:
    """A value of at most `chars` characters that begins with none of the prompt's placeholders'
    stems ("Suggested next message" and whatever follows: "... 12") and is none of its example
    answers (`copies`)."""
    beginnings = [f for stem in stems for f in _forms(stem)]
    pattern: dict[str, object] = {"pattern": "^(?:" + "|".join(map(re.escape, beginnings)) + ")"}
    excluded: dict[str, object] = (
        {"anyOf": [{"enum": copies(examples)}, pattern]} if examples else pattern
    )
    return {"type": "string", "minLength": 1, "maxLength": chars, "not": excluded}


def _strings(most: int, fewest: int, chars: int, stems: tuple[str, ...]) -> dict[str, object]:
    return {
        "type": "array",
        "items": _string(chars, stems),
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


# what each prompt shows as the shape of its answer ("### Output": a value may not begin with
# them) and, for titles, the example answers it lists ("### Examples": a value may not be one).
# The tags prompt's domains ("Science, Technology, ...") are suggestions to use, and stay allowed.
TITLE_STEMS = ("your concise",)  # and "Your concise summary here!", seen once the title was barred
TITLE_EXAMPLES = ("Stock Trends", "Chocolate Chip Cookies", "Music Streaming", "Remote Work")
TAG_STEMS = tuple(f"tag{d}" for d in range(10))  # "tag1", and "tag4" after it
# "Suggested next message 1" barred, the model wrote "Suggested next message 12", then "Suggested
# next request 1" and "Suggested next [insert action]" (Open WebUI as shipped, 2026-12-07): a
# user's next message does not begin "Suggested"
FOLLOW_UP_STEMS = ("Suggested",)


@dataclass(frozen=True)
class UiTask:
    name: str
    opening: str  # the task prompt's first lines (Open WebUI 0.12.4's config.py)
    shape: str  # its "### Output" line: the object it asks for
    # that object as a schema, bounded (a small model may not stop a string), its values never
    # a copy of the prompt's own placeholders or example values (`copies`)
    schema_json: str


TASKS = (
    UiTask(
        "open-webui title",
        "### Task:\nGenerate a concise title summarizing the chat history.",
        'JSON format: { "title": "your concise title here" }',
        _object("title", _string(60, TITLE_STEMS, TITLE_EXAMPLES)),
    ),
    UiTask(
        "open-webui tags",
        "### Task:\nGenerate 1-3 broad tags categorizing the main themes of the chat history",
        'JSON format: { "tags": ["tag1", "tag2", "tag3"] }',
        _object("tags", _strings(6, 1, 32, TAG_STEMS)),
    ),
    UiTask(
        "open-webui follow-ups",
        "### Task:\nPredict 3-5 useful messages this user might naturally send next",
        'JSON format: { "follow_ups": ["Suggested next message 1", "Suggested next message 2",'
        ' "Suggested next message 3"] }',
        _object("follow_ups", _strings(3, 1, 120, FOLLOW_UP_STEMS)),
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
