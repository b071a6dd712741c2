"""How a chat UI reads its side tasks' answers (Open WebUI: the text from the first "{" to the last
"}"), as a class: the object asked for with values of the model's own, with values that are words of
the prompt (near-copies), with a value equal to one of the prompt's placeholders or example answers,
or prose. Pure stdlib: bench/open_webui.py runs in Open WebUI's environment, without sinkd."""

from __future__ import annotations

import json
import re

CLASSES = ("object", "copied", "placeholder", "prose")


def placeholders(prompt: str, key: str) -> set[str]:
    """The values the prompt itself shows: its "JSON format" line's and its examples' (read from
    the prompt, not from sinkd's list), lower case."""
    shown = re.findall(r"\{ *\"" + key + r"\": *(\[[^\]]*\]|\"[^\"]*\") *\}", prompt)
    found: set[str] = set()
    for text in shown:
        value = json.loads(text)
        found.update(v.lower() for v in ([value] if isinstance(value, str) else value))
    return found


def _bare(value: str) -> str:
    return value.strip().rstrip(".,!?;:").strip().lower()


def classify(content: str, key: str, prompt: str) -> tuple[str, list[str]]:
    """The answer's class, and its values that are words of the prompt (for a placeholder: the
    values that copy one)."""
    try:
        value = json.loads(content[content.find("{") : content.rfind("}") + 1])[key]
    except (ValueError, KeyError, TypeError):
        return "prose", []
    values = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    if not values or not all(isinstance(v, str) and v.strip() for v in values):
        return "prose", []
    shown = placeholders(prompt, key)
    copied = [v for v in values if v.lower() in shown or _bare(v) in shown]
    if copied:
        return "placeholder", copied  # the prompt's own words
    near = [v for v in values if v.strip().lower() in prompt.lower()]
    return ("copied" if len(near) == len(values) else "object"), near
