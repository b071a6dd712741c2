"""`sinkd chat`: an interactive session, streamed, with slash commands and a status line."""

from __future__ import annotations

import dataclasses
import enum
import sys
from typing import Annotated, TextIO

import typer
from rich.console import Console

from sinkd.cachepolicy import PolicyName
from sinkd.cli.backend import Backend
from sinkd.cli.console import OWED, console, terminal_safe
from sinkd.cli.exit_codes import handle_errors
from sinkd.cli.options import (
    CompactOpt,
    ConnectOpt,
    EvictOpt,
    ModelOpt,
    PolicyOpt,
    SinksOpt,
    TokenOpt,
    WindowOpt,
    policy_request,
    session_backend,
)
from sinkd.cli.sessions import _span, receipt_table
from sinkd.daemon.models.registry import load_lock
from sinkd.daemon.runtime.api import (
    ChatRequest,
    Done,
    GenerationOptions,
    Handle,
    RecallReport,
    RecallRequest,
    Receipt,
    SamplingRequest,
    TokenEvent,
)

err = console(stderr=True)

HELP = "/reset  /fork  /receipt  /trace  /help  /quit   (anything else is your message)"


def recall_line(report: RecallReport) -> str:
    """One line: what this turn's recall brought back into the cache (text, not the model's
    earlier state), or why nothing."""
    alone = f"; {report.search}" if report.search.startswith("bm25 alone") else ""
    if not report.recalled:
        return f"[recall: {report.note or 'nothing recalled'}{alone}]"
    where = ", ".join(
        (
            f"#{s.passage_id} from conversation {s.conversation} (score {s.score:.1f})"
            if s.conversation
            else f"#{s.passage_id} from {_span(s.source)} (score {s.score:.1f})"
        )
        for s in report.recalled
    )
    n = len(report.recalled)
    return f"[recall: {n} passage(s) of earlier text back in the cache: {where}{alone}]"


class ChatLoop:
    def __init__(
        self, backend: Backend, handle: Handle, max_tokens: int | None, out: TextIO, err: Console
    ) -> None:
        self.backend = backend
        self.handle = handle
        self.max_tokens = max_tokens
        self.out = out
        self.err = err
        self.last_reply = (
            ""  # kept in the tenant's memory if the next message asks ("remember that")
        )

    def status(self, receipt: Receipt) -> None:
        p = receipt.policy
        self.err.print(
            f"[dim]\\[{receipt.session_id} gen {receipt.generation[:8]} | retained"
            f" {receipt.retained}/{p.sinks + p.window} | seen {receipt.n_seen} |"
            f" evicted {receipt.evicted_tokens} in {receipt.evictions}][/dim]"
        )

    def command(self, line: str) -> bool:
        """Run a slash command; False to quit."""
        cmd = line.split()[0].lower()
        if cmd in ("/quit", "/exit"):
            return False
        if cmd == "/reset":
            receipt, erased = self.backend.reset(self.handle)
            self.handle = receipt.handle
            self.err.print(
                "reset: a new generation, every cell freed (evicted and earlier text is gone)"
            )
            if erased.purge_owed:
                self.err.print(f"note: {OWED}")
            self.status(receipt)
        elif cmd == "/fork":
            receipt = self.backend.fork(self.handle)
            self.handle = receipt.handle
            self.err.print(
                f"forked: now talking in {self.handle.session_id}; the parent is unchanged"
            )
            self.status(receipt)
        elif cmd == "/receipt":
            self.err.print(receipt_table(self.backend.inspect(self.handle).receipt))
        elif cmd == "/trace":
            events = self.backend.trace(self.handle)
            for e in events[-10:]:
                if e.kind == "recall":
                    self.err.print(
                        f"at token {e.at_token}: recalled passage {e.passage_id} (first seen"
                        f" at {_span(e.recalled_source)}) into {_span(e.recalled_logical)}"
                    )
                    continue
                self.err.print(
                    f"at token {e.at_token}: evicted logical {_span(e.evicted_logical)}"
                    f" (cache {_span(e.evicted_cache)}), shift {e.shift_delta}"
                )
            if not events:
                self.err.print("no evictions yet")
        else:
            self.err.print(HELP)
        return True

    def turn(self, message: str) -> None:
        done: Done | None = None
        request = ChatRequest(
            message, GenerationOptions(self.max_tokens), reply_before=self.last_reply
        )
        pieces: list[str] = []
        for event in self.backend.chat(self.handle, request):
            if isinstance(event, TokenEvent):
                pieces.append(event.text)
                self.out.write(terminal_safe(event.text))
                self.out.flush()
            else:
                done = event
        self.last_reply = "".join(pieces)
        self.out.write("\n")
        assert done is not None  # a stream ends with Done or raises
        if done.recall is not None:
            self.err.print(recall_line(done.recall), markup=False, highlight=False)
        self.status(done.receipt)

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


# cells for an embedded chat (bench/chat_defaults.py: ITL and memory by window); its window fills
# them, within what the model allows (Gemma 3's sliding window: 512 positions)
CHAT_CELLS = 1024


PLAIN_SAMPLING = SamplingRequest(  # SamplingParams' defaults: a remote daemon gets the same
    temperature=0.0, top_k=40, top_p=0.95, min_p=0.05, seed=0, repeat_penalty=1.0
)


class RecallModeOpt(str, enum.Enum):
    OFF = "off"
    MANUAL = "manual"
    AUTO = "auto"


@handle_errors
def chat(
    embedded: Annotated[
        bool, typer.Option("--embedded", help="Run the model in this process, no daemon.")
    ] = False,
    address: ConnectOpt = None,
    token: TokenOpt = None,
    model: ModelOpt = None,
    system: Annotated[str, typer.Option("--system", help="System prompt.")] = "",
    pin_system: Annotated[
        bool, typer.Option("--pin-system", help="Keep the whole system prompt as sinks.")
    ] = False,
    policy: PolicyOpt = PolicyName.SINK,
    sinks: SinksOpt = None,
    window: WindowOpt = None,
    evict: EvictOpt = None,
    compact: CompactOpt = None,
    max_tokens: Annotated[
        int | None,
        typer.Option("--max-tokens", min=1, help="Longest reply (unset: to the end of the turn)."),
    ] = None,
    recall: Annotated[
        RecallModeOpt | None,
        typer.Option(
            "--recall",
            help="auto: before each turn, bring evicted text that matches your message back into"
            " the cache (a line says what); manual: keep it, recall on request; off: keep"
            " nothing. Default: auto for the sink policy.",
        ),
    ] = None,
    temperature: Annotated[
        float | None, typer.Option("--temperature", min=0.0, help="0: greedy.")
    ] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", min=0)] = None,
    top_p: Annotated[float | None, typer.Option("--top-p")] = None,
    min_p: Annotated[float | None, typer.Option("--min-p")] = None,
    repeat_penalty: Annotated[
        float | None,
        typer.Option("--repeat-penalty", help="Over the last 64 tokens; 1: off."),
    ] = None,
    seed: Annotated[int | None, typer.Option("--seed", min=0)] = None,
    private: Annotated[
        bool,
        typer.Option(
            "--private",
            help="Keep this conversation out of your tenant's memory across conversations.",
        ),
    ] = False,
) -> None:
    """Talk to a session; replies stream as they are generated. /reset /fork /receipt /trace /quit.

    Sampling: the model's recommended settings (models.lock), unless any option below is given;
    then the given ones, the others at their plain defaults (greedy, top-k 40, top-p 0.95, ...)."""
    pol = policy_request(policy.value, sinks, window, evict, compact, pin_system)
    # a conversation's worth, as the session's cells and the model allow: one long reply evicts
    # no earlier turn
    pol = dataclasses.replace(pol, fill_window=window is None and policy is not PolicyName.FULL)
    given = (temperature, top_k, top_p, min_p, repeat_penalty, seed)
    sampling = None
    if any(v is not None for v in given):
        plain = PLAIN_SAMPLING
        sampling = SamplingRequest(
            temperature=plain.temperature if temperature is None else temperature,
            top_k=plain.top_k if top_k is None else top_k,
            top_p=plain.top_p if top_p is None else top_p,
            min_p=plain.min_p if min_p is None else min_p,
            seed=plain.seed if seed is None else seed,
            repeat_penalty=plain.repeat_penalty if repeat_penalty is None else repeat_penalty,
        )
    cells = load_lock().get(model).max_budget(CHAT_CELLS)
    backend = session_backend(embedded, address, token, model, cells)
    try:
        receipt = backend.create(
            pol,
            system_prompt=system,
            recall=RecallRequest(mode=recall.value if recall else None, private=private),
            sampling=sampling,
        )
        loop = ChatLoop(backend, receipt.handle, max_tokens, sys.stdout, err)
        loop.status(receipt)
        loop.run(sys.stdin)
    finally:
        backend.shutdown()
