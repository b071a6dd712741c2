"""A chat UI's side tasks with and without `ui_task_grammar`: Open WebUI 0.12.4's default title,
tags and follow-up prompts over a few short chats, sent as Open WebUI sends them (one user message,
no format, no sampling: the model's own), and each answer read as Open WebUI reads it (the text from
its first "{" to its last "}"): the object asked for with values of the model's own, with values
that are words of the prompt ("near-copies", written out: they are Open WebUI's text), with a value
equal to one of the prompt's placeholders or example answers (its "JSON format" line and its
examples, in any case, a stop or comma after), or prose. Only the classes and near-copies are
written.

    python bench/ui_tasks.py        -> bench/results/ui_tasks.json
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import machine, table, write  # noqa: E402
from task_answers import CLASSES, classify  # noqa: E402

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
    [("user", "Which is better for a beginner, a ukulele or a guitar?"),
     ("assistant", "A ukulele: four nylon strings, small frets, and simple chords to start with.")],
    [("user", "How long should I boil an egg for a runny yolk?"),
     ("assistant", "Six minutes from boiling water, then straight into cold water.")],
]  # fmt: skip


def run(grammar: bool) -> dict[str, Any]:
    counts: dict[str, dict[str, int]] = {t: dict.fromkeys(CLASSES, 0) for t in TASKS}
    near: dict[str, list[str]] = {t: [] for t in TASKS}
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
                    content = reply.choices[0].message.content or ""
                    kind, copies = classify(content, key, prompt)
                    counts[task][kind] += 1
                    near[task] += copies
        finally:
            d.stop()
    return {"forms": counts, "near_copies": near, "seconds_total": round(sum(seconds), 1)}


def main() -> None:
    on, off = run(True), run(False)
    rows = []
    for task in TASKS:
        for name, result in (("on", on), ("off", off)):
            f = result["forms"][task]
            rows.append([task, name, f["object"], f["copied"], f["near-copy"], f["placeholder"],
                         f["prose"],
                         ", ".join(sorted(set(result["near_copies"][task]))) or "-"])  # fmt: skip
    table(f"Open WebUI's task prompts, {len(CHATS)} chats each ({MODEL})",
          ["task", "ui_task_grammar", "the model's own", "words of the prompt",
           "a placeholder's shape", "a placeholder", "prose", "the values copied"],
          rows)  # fmt: skip
    print(f"seconds: on {on['seconds_total']}, off {off['seconds_total']}")
    path = write("ui_tasks", {"machine": machine(), "model": MODEL, "chats": len(CHATS),
                              "on": on, "off": off})  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
