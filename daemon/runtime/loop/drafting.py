"""Drafts for speculative decoding: the next tokens guessed from the session's own text, and how
many of them are worth verifying. Pure: no llama.cpp, no clocks.

The guess is prompt lookup (vLLM's and SGLang's `ngram` proposer, llama.cpp's `ngram-simple`):
find the latest earlier place where the stream's last few tokens occurred, and propose what
followed them there. Text that repeats itself (a log's lines, JSON's keys, a reply quoting the
question or a recalled passage) is guessed right; a chat with nothing to look up finds no match
and drafts nothing.

How many to verify is a trade. A verification decodes the pending token and the drafts in one
pass, which costs more the more rows it carries (on a 2-core CPU 2 rows cost ~1.5 of one, 5 rows
~2.6; on a GPU about one), and yields the accepted drafts plus the pending token. `DraftControl`
keeps how often a session's first draft is taken and how often one after a taken one is, and
picks the length that maximises tokens per cost under that model; where no length pays, the
session drafts nothing but a one-token probe now and then, after a long match, so that a session
whose text turns repetitive finds out.

A clock is read by the executor alone (`DecodeCosts.observe`): the length chosen follows the
machine's speed, the tokens never do (the executor verifies them one by one).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

MIN_MATCH = 2  # a single repeated token predicts little
MAX_MATCH = 8  # longer suffixes are tried first: the longer the match, the better the guess
PRIOR_FIRST = 0.6  # a session's first drafts are tried ...
PRIOR_THEN = 0.8  # ... at a length of two or three
LEARNING_RATE = 0.1  # of the acceptance estimates, per draft verified
PROBE_EVERY = 16  # tokens a session that does not draft decodes between two one-token probes
PROBE_MATCH = 4  # a probe's draft follows a match of at least this many tokens
EXPLORE_EVERY = 8  # every this many lengths chosen, one draft more than pays (learning its worth)


def lookup(
    context: Sequence[int], k: int, min_n: int = MIN_MATCH, max_n: int = MAX_MATCH
) -> list[int]:
    """Up to `k` tokens that followed the latest earlier occurrence of the context's longest
    suffix of `max_n` down to `min_n` tokens; [] where none occurs. A byte search over the ids
    (C speed: ~20 us over a 1,024-token window)."""
    n_ctx = len(context)
    if k <= 0 or n_ctx <= min_n:
        return []
    hay = array("i", context).tobytes()
    last_start = len(hay) - 4  # an occurrence must end before the last token: something follows
    for n in range(min(max_n, n_ctx - 1), min_n - 1, -1):
        pattern = hay[-4 * n :]
        end = last_start
        while True:
            at = hay.rfind(pattern, 0, end)
            if at < 0:
                break
            if at % 4 == 0:  # on a token's boundary, not inside two
                start = at // 4 + n
                return list(context[start : start + k])
            end = at + len(pattern) - 1
    return []


class DecodeCosts:
    """What a pass of one sequence costs by the rows it carries, relative to one row: a prior
    until measured (`observe`), then a running mean of the measured times. Engine-wide."""

    def __init__(self, prior_per_row: float = 0.45, max_rows: int = 17) -> None:
        self.prior_per_row = prior_per_row
        self._seconds: list[float | None] = [None] * (max_rows + 1)
        self._seen = [0] * (max_rows + 1)

    def observe(self, rows: int, seconds: float) -> None:
        if not 0 < rows < len(self._seconds):
            return
        old = self._seconds[rows]
        self._seen[rows] += 1
        rate = max(0.05, 1.0 / self._seen[rows])
        self._seconds[rows] = seconds if old is None else old + rate * (seconds - old)

    def ratio(self, rows: int, sequences: int = 1) -> float:
        """Cost of a pass where each of `sequences` sequences carries `rows` rows over the same
        pass with one row each. One sequence: measured (both at least 3 times), else the prior.
        Several: a pass is a fixed part and a part per row, the split one sequence's two-row pass
        shows; so the more sequences share a step, the more a draft's row costs against it."""
        rows = min(rows, len(self._seconds) - 1)
        if rows <= 1:
            return 1.0
        if sequences <= 1:
            one, many = self._seconds[1], self._seconds[rows]
            if one and many and self._seen[1] >= 3 and self._seen[rows] >= 3:
                return max(1.0, many / one)
            return 1.0 + self.prior_per_row * (rows - 1)
        per_row = min(1.0, self.ratio(2) - 1.0)  # of a one-row pass
        fixed = 1.0 - per_row
        return (fixed + per_row * sequences * rows) / (fixed + per_row * sequences)


class DraftControl:
    """One session's drafting: how often its first draft is taken, how often a draft after a
    taken one is (copied text runs on once it starts: the second is the higher), and the length
    that pays."""

    def __init__(self, max_drafts: int) -> None:
        self.max_drafts = max_drafts
        self.first = PRIOR_FIRST
        self.then = PRIOR_THEN
        self.since_draft = 0  # tokens decoded since its last verification
        self.chosen = 0  # lengths chosen
        self.probing = False  # the last length is a probe's
        self.drafted = 0
        self.accepted = 0

    def length(self, costs: DecodeCosts, sequences: int = 1) -> int:
        """How many drafts to verify with the next token (0: none), in a step where `sequences`
        sessions decode: the length with the most expected tokens per cost, or a one-token probe
        after PROBE_EVERY tokens without one (`probing`: its draft needs a match of PROBE_MATCH
        tokens)."""
        best, best_gain = 0, 1.0
        expected = 1.0  # tokens a pass yields: the pending one, then draft i with p1 * pc^(i-1)
        for k in range(1, self.max_drafts + 1):
            expected += self.first * self.then ** (k - 1)
            gain = expected / costs.ratio(k + 1, sequences)
            if gain > best_gain * 1.02:  # a gain within noise is not worth the longer pass
                best, best_gain = k, gain
        if best == 0 and self.max_drafts and self.since_draft >= PROBE_EVERY:
            self.probing = True  # one draft, where a long match (PROBE_MATCH) makes it likely
            return 1
        self.probing = False
        self.chosen += best > 0
        if best and best < self.max_drafts and self.chosen % EXPLORE_EVERY == 0:
            return best + 1  # now and then one more: what it yields and costs is learnt too
        return best

    def observe(self, drafted: int, accepted: int) -> None:
        """A verification of `drafted` tokens accepted the first `accepted`."""
        if drafted <= 0:
            return
        self.drafted += drafted
        self.accepted += accepted
        self.since_draft = 0
        self.first = _learned(self.first, accepted >= 1)
        for _ in range(max(0, accepted - 1)):  # each draft after a taken one: taken
            self.then = _learned(self.then, True)
        if 1 <= accepted < drafted:  # ... and the one that was not
            self.then = _learned(self.then, False)

    def skipped(self) -> None:
        """A token decoded without drafts."""
        self.since_draft += 1


def _learned(p: float, taken: bool) -> float:
    return p + LEARNING_RATE * ((1.0 if taken else 0.0) - p)
