"""`sinkd chat`: an interactive session, streamed, with slash commands and a status line."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from rich.console import Console

from sinkd.cli.backend import Backend, Handle
from sinkd.cli.sessions import _span, receipt_table

HELP = "/reset  /fork  /receipt  /trace  /help  /quit   (anything else is your message)"


def recall_line(report: dict[str, Any]) -> str:
    """One line: what this turn's recall brought back into the cache (text, not the model's
    earlier state), or why nothing."""
    spans = report.get("recalled") or []
    if not spans:
        return f"[recall: {report.get('note', 'nothing recalled')}]"
    where = ", ".join(
        f"#{s['passage_id']} from {_span(s['source_logical'])} (score {s['score']:.1f})"
        for s in spans
    )
    return f"[recall: {len(spans)} passage(s) of earlier text back in the cache: {where}]"


class ChatLoop:
    def __init__(
        self, backend: Backend, handle: Handle, max_tokens: int, out: TextIO, err: Console
    ) -> None:
        self.backend = backend
        self.handle = handle
        self.max_tokens = max_tokens
        self.out = out
        self.err = err

    def status(self, receipt: dict[str, Any]) -> None:
        p = receipt["policy"]
        self.err.print(
            f"[dim]\\[{receipt['session_id']} gen {receipt['generation'][:8]} | retained"
            f" {receipt['retained']}/{p['sinks'] + p['window']} | seen {receipt['n_seen']} |"
            f" evicted {receipt['evicted_tokens']} in {receipt['evictions']}][/dim]"
        )

    def command(self, line: str) -> bool:
        """Run a slash command; False to quit."""
        cmd = line.split()[0].lower()
        if cmd in ("/quit", "/exit"):
            return False
        if cmd == "/reset":
            self.handle, receipt = self.backend.reset(self.handle)
            self.err.print(
                "reset: a new generation, every cell freed (evicted and earlier text is gone)"
            )
            self.status(receipt)
        elif cmd == "/fork":
            self.handle, receipt = self.backend.fork(self.handle)
            self.err.print(
                f"forked: now talking in {self.handle.session_id}; the parent is unchanged"
            )
            self.status(receipt)
        elif cmd == "/receipt":
            receipt, _ = self.backend.inspect(self.handle)
            self.err.print(receipt_table(receipt))
        elif cmd == "/trace":
            events = self.backend.trace(self.handle)
            for e in events[-10:]:
                if e.get("kind") == "recall":
                    self.err.print(
                        f"at token {e['at_token']}: recalled passage {e['passage_id']} (first seen"
                        f" at {_span(e['recalled_source'])}) into {_span(e['recalled_logical'])}"
                    )
                    continue
                self.err.print(
                    f"at token {e['at_token']}: evicted logical {_span(e['evicted_logical'])}"
                    f" (cache {_span(e['evicted_cache'])}), shift {e['shift_delta']}"
                )
            if not events:
                self.err.print("no evictions yet")
        else:
            self.err.print(HELP)
        return True

    def turn(self, message: str) -> None:
        receipt: dict[str, Any] = {}
        recall: dict[str, Any] | None = None
        for kind, payload in self.backend.chat(self.handle, message, self.max_tokens, []):
            if kind == "token":
                self.out.write(payload["text"])
                self.out.flush()
            else:
                receipt = payload["receipt"]
                recall = payload.get("recall")
        self.out.write("\n")
        if recall:
            self.err.print(recall_line(recall), markup=False, highlight=False)
        self.status(receipt)

    def run(self, lines: TextIO = sys.stdin) -> None:
        interactive = lines.isatty()
        self.err.print(HELP)
        while True:
            if interactive:
                self.err.print("[bold]you>[/bold] ", end="")
            line = lines.readline()
            if not line:
                break
            line = line.strip()
            if not line:
                continue
            if line.startswith("/"):
                if not self.command(line):
                    break
            else:
                self.turn(line)
