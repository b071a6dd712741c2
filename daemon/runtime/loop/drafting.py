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
MATCH_CLASSES = (2, 4, 6)  # matches of 2-3, 4-5 and 6 or more tokens: each learns its acceptance
PRIOR_FIRST = 0.6  # a session's first drafts are tried ...
PRIOR_THEN = 0.8  # ... at a length of two or three
PRIOR_WEIGHT = 2  # the priors count as this many drafts seen: one rejection halves a hope
LEARNING_RATE = 0.1  # of the acceptance estimates, per draft verified, once past the prior
PROBE_EVERY = 16  # tokens a session that does not draft decodes before a one-token probe ...
PROBE_MAX = 1024  # ... doubled after each probe rejected, up to this; reset by one taken
PROBE_MATCH = 4  # a probe's draft follows a match of at least this many tokens
EXPLORE_EVERY = 8  # every this many lengths chosen, one draft more than pays (learning its worth)
MIN_GAIN = 1.05  # expected tokens per cost a draft must promise over none


def lookup(
    context: Sequence[int], k: int, min_n: int = MIN_MATCH, max_n: int = MAX_MATCH
) -> list[int]:
    """Up to `k` tokens that followed the latest earlier occurrence of the context's longest
    suffix of `max_n` down to `min_n` tokens; [] where none occurs."""
    return match(context, k, min_n, max_n)[0]


def match(
    context: Sequence[int], k: int, min_n: int = MIN_MATCH, max_n: int = MAX_MATCH
) -> tuple[list[int], int]:
    """`lookup`'s drafts and the length of the suffix they follow (0: none). A byte search over
    the ids (C speed: ~20 us over a 1,024-token window)."""
    n_ctx = len(context)
    if k <= 0 or n_ctx <= min_n:
        return [], 0
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
                return list(context[start : start + k]), n
            end = at + len(pattern) - 1
    return [], 0


def match_class(n: int) -> int:
    """Which of MATCH_CLASSES a match of `n` tokens falls in."""
    return sum(n >= c for c in MATCH_CLASSES[1:])


class DecodeCosts:
    """What a pass of one sequence costs by the rows it carries, relative to one row: a prior
    until measured (`observe`), then a running mean of the measured times. Engine-wide."""

    def __init__(self, prior_per_row: float = 0.45, max_rows: int = 17) -> None:
        self.prior_per_row = prior_per_row
        self._seconds: list[float | None] = [None] * (max_rows + 1)
        self._seen = [0] * (max_rows + 1)
        self._per_row: float | None = None
        self._total = [0.0] * (max_rows + 1)  # every pass's seconds, by rows (for metrics)

    def observe(self, rows: int, seconds: float) -> None:
        if not 0 < rows < len(self._seconds):
            return
        old = self._seconds[rows]
        self._seen[rows] += 1
        self._total[rows] += seconds
        rate = max(0.05, 1.0 / self._seen[rows])
        self._seconds[rows] = seconds if old is None else old + rate * (seconds - old)
        self._per_row = None  # derived from the measured passes: again at its next use

    def totals(self) -> dict[int, tuple[int, float]]:
        """Passes measured and their seconds, by rows."""
        return {rows: (n, self._total[rows]) for rows, n in enumerate(self._seen) if n}

    def per_row(self) -> float:
        """What a row past the first adds to a pass, of a one-row pass: the mean of what the
        lengths measured so far show (a length not yet measured costs what they say, not the
        prior: on a compute-bound CPU a row costs ~0.8, twice the prior), else the prior."""
        if self._per_row is None:
            self._per_row = self._measured_per_row()
        return self._per_row

    def _measured_per_row(self) -> float:
        one = self._seconds[1]
        if not one or self._seen[1] < 3:
            return self.prior_per_row
        slopes = [
            (seconds / one - 1.0) / (rows - 1)
            for rows, seconds in enumerate(self._seconds)
            if rows >= 2 and seconds and self._seen[rows] >= 3
        ]
        return max(0.0, sum(slopes) / len(slopes)) if slopes else self.prior_per_row

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
            return 1.0 + self.per_row() * (rows - 1)
        per_row = min(1.0, self.ratio(2) - 1.0)  # of a one-row pass
        fixed = 1.0 - per_row
        return (fixed + per_row * sequences * rows) / (fixed + per_row * sequences)


class DraftControl:
    """One session's drafting: how often its first draft is taken, learnt apart for short, middle
    and long matches (a long match is a better guess: a log's line, a quoted span), how often a
    draft after a taken one is (copied text runs on once it starts: the higher), and the length
    that pays. Rejections are learnt fast (the prior weighs PRIOR_WEIGHT drafts), so a stream
    whose drafts are rejected pays for a few of them, then only for probes that grow rarer."""

    def __init__(self, max_drafts: int) -> None:
        self.max_drafts = max_drafts
        self.first = [PRIOR_FIRST] * len(MATCH_CLASSES)
        self._first_seen = [0] * len(MATCH_CLASSES)
        self.then = PRIOR_THEN
        self._then_seen = 0
        self.since_draft = 0  # tokens decoded since its last verification
        self.probe_every = PROBE_EVERY
        self.chosen = 0  # lengths chosen
        self.probing = False  # the last length is a probe's
        self._class = 0  # the match class of the last length chosen
        self.drafted = 0
        self.accepted = 0

    def length(self, costs: DecodeCosts, sequences: int = 1, matched: int = MAX_MATCH) -> int:
        """How many drafts to verify with the next token (0: none), in a step where `sequences`
        sessions decode, after a match of `matched` tokens: the length with the most expected
        tokens per cost, or a one-token probe once `probe_every` tokens went without one, after
        a match of PROBE_MATCH tokens or more (`probing`)."""
        self._class = match_class(matched)
        best = self._best(self.first[self._class], costs, sequences)
        due = self.since_draft >= self.probe_every and matched >= PROBE_MATCH
        if best == 0 and self.max_drafts and due:
            self.probing = True  # one draft, where a long match makes it likely
            return 1
        self.probing = False
        self.chosen += best > 0
        if best and best < self.max_drafts and self.chosen % EXPLORE_EVERY == 0:
            return best + 1  # now and then one more: what it yields and costs is learnt too
        return best

    def worth_looking(self, costs: DecodeCosts, sequences: int = 1) -> bool:
        """Whether a lookup could lead to drafts now: a probe is due, or some match class pays.
        Where none does, the session skips the lookup (a list of its tokens and a byte search,
        each token) as well as the drafts."""
        due = self.max_drafts > 0 and self.since_draft >= self.probe_every
        return due or self._best(max(self.first), costs, sequences) > 0

    def _best(self, first: float, costs: DecodeCosts, sequences: int) -> int:
        best, best_gain = 0, 1.0
        expected = 1.0  # tokens a pass yields: the pending one, then draft i with p1 * pc^(i-1)
        for k in range(1, self.max_drafts + 1):
            expected += first * self.then ** (k - 1)
            gain = expected / costs.ratio(k + 1, sequences)
            # drafting at all must pay clearly (a verification's Python and a rejected draft's
            # removal are not in the pass's cost); a longer draft must pay beyond noise
            if gain > best_gain * (MIN_GAIN if best == 0 else 1.02):
                best, best_gain = k, gain
        return best

    def observe(self, drafted: int, accepted: int) -> None:
        """A verification of `drafted` tokens (of the length last chosen) accepted the first
        `accepted`."""
        if drafted <= 0:
            return
        self.drafted += drafted
        self.accepted += accepted
        self.since_draft = 0
        if self.probing:  # a probe rejected: the next comes twice as late
            self.probe_every = PROBE_EVERY if accepted else min(2 * self.probe_every, PROBE_MAX)
        c = self._class
        self.first[c] = _learned(self.first[c], accepted >= 1, self._first_seen[c])
        self._first_seen[c] += 1
        for _ in range(max(0, accepted - 1)):  # each draft after a taken one: taken
            self.then = _learned(self.then, True, self._then_seen)
            self._then_seen += 1
        if 1 <= accepted < drafted:  # ... and the one that was not
            self.then = _learned(self.then, False, self._then_seen)
            self._then_seen += 1

    def skipped(self) -> None:
        """A token decoded without drafts."""
        self.since_draft += 1


def _learned(p: float, taken: bool, seen: int) -> float:
    """The estimate after one more draft: a mean with the prior counted as PRIOR_WEIGHT drafts,
    then a moving one (LEARNING_RATE), so that a session whose text changes follows it."""
    rate = max(LEARNING_RATE, 1.0 / (PRIOR_WEIGHT + seen + 1))
    return p + rate * ((1.0 if taken else 0.0) - p)
