"""Turn generated token pieces into text safely: whole UTF-8 characters, stop strings held back."""

from __future__ import annotations

import codecs


class TextAssembler:
    """Feed each token's bytes; get back the text that is safe to emit now.

    A multi-byte character split across tokens is held until complete. Text that could still become
    a stop string is held back, so a client never sees part of a stop string; when a stop string
    appears, the text before it is released and `stopped` is set.
    """

    def __init__(self, stops: list[str]) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = [s for s in stops if s]
        self._held = ""
        self.stopped: str | None = None

    @property
    def has_stops(self) -> bool:
        return bool(self._stops)

    def feed(self, piece: bytes) -> str:
        if self.stopped is not None:
            return ""
        self._held += self._decoder.decode(piece)
        for stop in self._stops:
            at = self._held.find(stop)
            if at >= 0:
                self.stopped = stop
                out, self._held = self._held[:at], ""
                return out
        keep = self._partial_stop_suffix()
        out = self._held[: len(self._held) - keep]
        self._held = self._held[len(self._held) - keep :]
        return out

    def flush(self) -> str:
        """At the end of generation: whatever is held (an unfinished stop string is just text)."""
        if self.stopped is not None:
            return ""
        out = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return out

    def _partial_stop_suffix(self) -> int:
        """Length of the longest suffix of the held text that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(self._held)), best, -1):
                if self._held.endswith(stop[:n]):
                    best = n
                    break
        return best
