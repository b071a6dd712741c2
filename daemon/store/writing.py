"""Writing the memory as the stream evicts: every evicted token joins its session's open passage;
a passage is sealed at a boundary that follows the text (an end of line, of sentence or of turn)
once it holds `min_tokens`, or at `max_tokens`. Trimming and pruning shorten what is stored."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from sinkd.daemon.store.passages import PassageTable, Segmenting, SessionKey, text_of, unblob
from sinkd.daemon.store.speakers import NO_TURNS, SpeakerState, Turns, label

_BOUNDARY = re.compile(r"(\n|[.!?]\s*$|[.!?][\"')\]]\s*$)")

PRUNE_BATCH = 8  # passages read per round of pruning (an eviction prunes about one)


class EvictedText:
    def __init__(self, table: PassageTable, segmenting: Segmenting) -> None:
        self.table = table
        self.segmenting = segmenting

    def add(
        self,
        key: SessionKey,
        logical_start: int,
        tokens: Sequence[int],
        skip: Sequence[bool],
        piece: Callable[[int], bytes],
        turns: Turns = NO_TURNS,
        kept_before: Sequence[int] = (),
    ) -> int:
        """Store evicted tokens [logical_start, +len): those below the session's mark are stored
        already (a replay), those with `skip` are recalled copies; a skipped token seals the open
        passage so that a passage is always one contiguous range; a turn's header (`turns`: the
        template's, read as the stream goes) is not stored, and a passage is one turn's, its
        speaker the role the header named. `kept_before`: the tokens before the first eviction
        that are never evicted (the sinks), read first (the first turn's header is there).
        Returns tokens stored."""
        mark, state = self.table.reading(key)
        first = max(0, mark - logical_start)
        if mark == 0:
            label(kept_before, state, turns.marks, piece, turns.is_control)
        said = label(tokens[first:], state, turns.marks, piece, turns.is_control)
        stored = 0
        run: list[tuple[int, int, tuple[str, int]]] = []
        for i in range(first, len(tokens)):
            pos = logical_start + i
            who = said[i - first]
            if skip[i] or who is None:  # a recalled copy, or a turn header (framing)
                stored += self._extend(key, run, piece)
                run = []
                if skip[i]:
                    self.table.seal_open(key)
                continue
            run.append((pos, tokens[i], who))
        stored += self._extend(key, run, piece)
        end = logical_start + len(tokens)
        if end > mark:
            self.table.set_mark(key, end, state)
        return stored

    def _extend(
        self,
        key: SessionKey,
        run: list[tuple[int, int, tuple[str, int]]],
        piece: Callable[[int], bytes],
    ) -> int:
        """Add a contiguous run of tokens to the open passage, sealing (and opening a new one)
        where the segmenting says or a turn ends; one write per passage touched."""
        if not run:
            return 0
        seg = self.segmenting
        open_ = self.table.open_passage(key)
        if open_ is not None and (open_[2] != run[0][0] or open_[4] != run[0][2]):
            self.table.seal_open(key)  # not contiguous, or another speaker's: start afresh
            open_ = None
        pid: int | None = None
        start, toks, who = run[0][0], [], run[0][2]
        if open_ is not None:
            pid, start, _, data, _ = open_
            toks = list(unblob(data))
        for pos, tok, said in run:
            if toks and said != who:  # the next turn's (a passage is one turn's)
                self.table.write(key, pid, start, toks, text_of(toks, piece), True, who)
                pid, toks = None, []
            if not toks:
                start, who = pos, said
            toks.append(tok)
            tail = piece(tok).decode("utf-8", errors="ignore")
            boundary = seg.kind == "text" and len(toks) >= seg.min_tokens and _BOUNDARY.search(tail)
            if boundary or len(toks) >= seg.max_tokens:
                self.table.write(key, pid, start, toks, text_of(toks, piece), True, who)
                pid, toks = None, []
        if toks:
            self.table.write(key, pid, start, toks, text_of(toks, piece), False, who)
        return len(run)

    def trim(self, key: SessionKey, logical_end: int, piece: Callable[[int], bytes]) -> int:
        """At resume: drop evicted text at or beyond `logical_end` (committed ahead of the chunk
        that evicted it, which never was); a passage that straddles it keeps its head. Returns
        tokens dropped. The recalled copies are not evicted text: the recall log ends them where
        the resumed stream does."""
        dropped = 0
        for pid, p in self.table.rows(key):
            if p.logical[1] <= logical_end:
                continue
            keep = max(0, logical_end - p.logical[0])
            dropped += len(p.tokens) - keep
            if keep:  # the same passage, shortened in place: its number stays
                head = list(p.tokens[:keep])
                self.table.write(key, pid, p.logical[0], head, text_of(head, piece), False)
            else:
                self.table.delete([pid])
        if self.table.mark(key) > logical_end:
            # the reading of headers goes back too: to the speaker of the last text kept (a
            # header cut by the trim point is read as its turn's text)
            kept = [p for _, p in self.table.rows(key) if p.logical[0] < logical_end]
            last = kept[-1] if kept else None
            state = SpeakerState(last.speaker, last.turn) if last else SpeakerState()
            self.table.set_mark(key, logical_end, state)
        return dropped

    def prune(self, key: SessionKey, max_tokens: int) -> int:
        """Delete the oldest passages until at most `max_tokens` are stored; returns tokens
        pruned."""
        _, total, _ = self.table.sizes.of(key)
        pruned = 0
        while total - pruned > max_tokens:  # the oldest few at a time: never every row
            oldest = self.table.ids(key, limit=PRUNE_BATCH)
            if not oldest:
                break
            for pid, a, b in oldest:
                if total - pruned <= max_tokens:
                    break
                self.table.delete([pid])
                pruned += b - a
        return pruned
