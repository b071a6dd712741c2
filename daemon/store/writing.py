"""Writing the memory as the stream evicts: every evicted token joins its session's open passage;
a passage is sealed at a boundary that follows the text (an end of line, of sentence or of turn)
once it holds `min_tokens`, or at `max_tokens`. Trimming and pruning shorten what is stored."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from sinkd.daemon.store.passages import PassageTable, Segmenting, SessionKey, text_of, unblob

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
    ) -> int:
        """Store evicted tokens [logical_start, +len): those below the session's mark are stored
        already (a replay), those with `skip` are recalled copies; a skipped token seals the open
        passage so that a passage is always one contiguous range. Returns tokens stored."""
        mark = self.table.mark(key)
        stored = 0
        run: list[tuple[int, int]] = []
        for i, (tok, skipped) in enumerate(zip(tokens, skip, strict=True)):
            pos = logical_start + i
            if pos < mark:
                continue
            if skipped:
                stored += self._extend(key, run, piece)
                run = []
                self.table.seal_open(key)
                continue
            run.append((pos, tok))
        stored += self._extend(key, run, piece)
        end = logical_start + len(tokens)
        if end > mark:
            self.table.set_mark(key, end)
        return stored

    def _extend(
        self, key: SessionKey, run: list[tuple[int, int]], piece: Callable[[int], bytes]
    ) -> int:
        """Add a contiguous run of tokens to the open passage, sealing (and opening a new one)
        where the segmenting says; one write per passage touched."""
        if not run:
            return 0
        seg = self.segmenting
        open_ = self.table.open_passage(key)
        if open_ is not None and open_[2] != run[0][0]:  # not contiguous: start afresh
            self.table.seal_open(key)
            open_ = None
        pid: int | None = None
        start, toks = run[0][0], []
        if open_ is not None:
            pid, start, _, data = open_
            toks = list(unblob(data))
        for pos, tok in run:
            if not toks:
                start = pos
            toks.append(tok)
            tail = piece(tok).decode("utf-8", errors="ignore")
            boundary = seg.kind == "text" and len(toks) >= seg.min_tokens and _BOUNDARY.search(tail)
            if boundary or len(toks) >= seg.max_tokens:
                self.table.write(key, pid, start, toks, text_of(toks, piece), sealed=True)
                pid, toks = None, []
        if toks:
            self.table.write(key, pid, start, toks, text_of(toks, piece), sealed=False)
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
            self.table.set_mark(key, logical_end)
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
