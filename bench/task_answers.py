"""How a chat UI reads its side tasks' answers (Open WebUI: the text from the first "{" to the last
"}"), as a class: the object asked for with values of the model's own; with values that are words of
the prompt (its chat history included); with a value of a placeholder's shape (a near-copy:
"Suggestion 1", "Your concise summary here!"); with a value equal to one of the prompt's
placeholders or example answers; or prose. Pure stdlib: bench/open_webui.py runs in Open WebUI's environment, without sinkd."""

from __future__ import annotations

import json
import re

CLASSES = ("object", "copied", "near-copy", "placeholder", "prose")
_NUMBERED = re.compile(r"^\W*[A-Za-z]+( [A-Za-z]+)? \d+\W*$")  # "Suggestion 1", "Tag 4"


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
    alike = [v for v in values if _alike(v, shown)]
    if alike:
        return "near-copy", alike
    near = [v for v in values if v.strip().lower() in prompt.lower()]
    return ("copied" if len(near) == len(values) else "object"), near


def _alike(value: str, shown: set[str]) -> bool:
    """A placeholder's shape, not a chat's words: a word or two and a number ("Suggestion 1",
    "Recommendation 2"), or half or more of a placeholder's words in its order's first place
    ("Your concise summary here!", "Suggested next request 1")."""
    if _NUMBERED.match(value.strip()):
        return True
    words = re.findall(r"[a-z]+", value.lower())
    for placeholder in shown:
        theirs = re.findall(r"[a-z]+", placeholder)
        if len(theirs) >= 2 and words[:1] == theirs[:1]:
            common = len(set(words) & set(theirs))
            if common * 2 >= len(theirs):
                return True
    return False
