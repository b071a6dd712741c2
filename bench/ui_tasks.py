"""A chat UI's side tasks with and without `ui_task_grammar`: Open WebUI 0.12.4's default title,
tags and follow-up prompts over a few short chats, sent as Open WebUI sends them (one user message,
no format, no sampling: the model's own), and each answer read as Open WebUI reads it (the text from
its first "{" to its last "}"): the object asked for, that object with values copied from the
prompt's own examples, or prose. Only the classes are written.

    python bench/ui_tasks.py        -> bench/results/ui_tasks.json
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import machine, table, write  # noqa: E402

from tests.support import open_webui_tasks as owui  # noqa: E402
from tests.support.daemons import http_daemon, openai_client  # noqa: E402

MODEL = "smollm2-135m-instruct"
TASKS = {"title": (owui.TITLE, "title"), "tags": (owui.TAGS, "tags"),
         "follow-ups": (owui.FOLLOW_UP, "follow_ups")}  # fmt: skip
CHATS = [
    [("user", "How do I keep basil alive on a windowsill?"),
     ("assistant", "Give it sun, water when the soil is dry, and pinch off flower buds.")],
    [("user", "Explain how a bicycle gear works."),
     ("assistant", "A bicycle gear changes how far the wheel turns for each pedal stroke.")],
    [("user", "What is the capital of Australia?"),
     ("assistant", "Canberra is the capital of Australia.")],
    [("user", "Write a haiku about autumn rain."),
     ("assistant", "Cold rain on red leaves / the gutter sings all evening / tea steam on the glass")],
    [("user", "My sourdough starter smells like nail polish. Is it dead?"),
     ("assistant", "No: it is hungry. Feed it twice a day at a 1:1:1 ratio for a few days.")],
    [("user", "How do I undo my last git commit but keep the changes?"),
     ("assistant", "Run git reset --soft HEAD~1: the commit goes, the changes stay staged.")],
]  # fmt: skip


def form(content: str, key: str, prompt: str) -> str:
    try:
        value = json.loads(content[content.find("{") : content.rfind("}") + 1])[key]
    except (ValueError, KeyError, TypeError):
        return "prose"
    values = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    if not values or not all(isinstance(v, str) and v.strip() for v in values):
        return "prose"
    return "copied" if all(v.strip().lower() in prompt.lower() for v in values) else "object"


def run(grammar: bool) -> dict[str, Any]:
    counts: dict[str, dict[str, int]] = {t: {"object": 0, "copied": 0, "prose": 0} for t in TASKS}
    seconds: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        d = http_daemon(Path(tmp), ui_task_grammar=grammar)
        try:
            client = openai_client(d)
            for chat in CHATS:
                for task, (template, key) in TASKS.items():
                    prompt = owui.rendered(template, chat)
                    t0 = time.perf_counter()
                    reply = client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": prompt}],
                        max_tokens=400,
                    )  # fmt: skip
                    seconds.append(time.perf_counter() - t0)
                    counts[task][form(reply.choices[0].message.content or "", key, prompt)] += 1
        finally:
            d.stop()
    return {"forms": counts, "seconds_total": round(sum(seconds), 1)}


def main() -> None:
    on, off = run(True), run(False)
    rows = []
    for task in TASKS:
        for name, result in (("on", on), ("off", off)):
            f = result["forms"][task]
            rows.append([task, name, f["object"], f["copied"], f["prose"]])
    table(f"Open WebUI's task prompts, {len(CHATS)} chats each ({MODEL})",
          ["task", "ui_task_grammar", "object", "copied from the prompt", "prose"], rows)  # fmt: skip
    print(f"seconds: on {on['seconds_total']}, off {off['seconds_total']}")
    path = write("ui_tasks", {"machine": machine(), "model": MODEL, "chats": len(CHATS),
                              "on": on, "off": off})  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
