"""Drafts for speculative decoding: the next tokens guessed from the session's own text, and how
many of them are worth verifying. Pure: no llama.cpp, no clocks.

The guess is prompt lookup (vLLM's and SGLang's `ngram` proposer, llama.cpp's `ngram-simple`):
find the latest earlier place where the stream's last few tokens occurred, and propose what
followed them there. Text that repeats itself (a log's lines, JSON's keys, a reply quoting the
question or a recalled passage) is guessed right; a chat with nothing to look up finds no match
and drafts nothing.

How likely a guess is, the text says too (llama.cpp's `ngram-cache` keeps such counts): of the
last few places the same tokens occurred, how many went on as the draft does, draft by draft. A
log's lines agree on their fixed words and part at their numbers, so the drafts run up to where
the earlier lines disagreed. Each suffix length that occurs gives a guess: a long one is a
specific guess seen once, a short one a guess seen many times.

How many to verify is a trade. A verification decodes the pending token and the drafts in one
pass, which costs more the more rows it carries (on a 2-core CPU 2 rows cost ~1.6 of one, 5 rows
~3.4; on a GPU about one). `DraftControl` picks the guess and length with the most expected
tokens per cost, the text's agreement weighed by how far this session's drafts have been taken
as the text predicted (a sampled stream follows its text less than a greedy one; a narration
takes what its facts repeat and rejects what they said once: each class of support is trusted
apart). Where nothing pays, the session drafts nothing but a one-token probe now and then, after
an agreed match, so that a session whose drafts were rejected finds out when its text turns
predictable again.

A clock is read by the executor alone (`DecodeCosts.observe`): the length chosen follows the
machine's speed, the tokens never do (the executor verifies them one by one).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

MIN_MATCH = 2  # a single repeated token predicts little
MAX_MATCH = 8  # the longest suffix looked up
OCCURRENCES = 8  # earlier occurrences of a suffix weighed (the latest ones)
TRUST_PRIOR = 2.0  # a session's drafts start trusted as if two expected tokens were taken
# guesses are trusted apart by how many occurrences back them: a stream that takes what its text
# says again and again may reject what it said once (a narration takes its facts' recurring words
# and rejects a sentence seen once: 6 of 16 first drafts of such guesses taken, 2026-12-07)
SUPPORT = (1, 2, 4)  # the classes' least occurrences: once, two or three, four or more
SUPPORT_MOST = (*(least - 1 for least in SUPPORT[1:]), OCCURRENCES)  # ... and their most
TRUST_DECAY = 0.95  # of what was taken and expected, per verification: the stream is followed
PROBE_EVERY = 16  # tokens a session that does not draft decodes before a one-token probe ...
PROBE_MAX = 1024  # ... doubled after each probe rejected, up to this; reset by one taken
MIN_GAIN = 1.05  # expected tokens per cost a draft must promise over none
SLOW_START = 2  # a session drafts at most this many, and one more for each draft it had taken


@dataclass(frozen=True)
class Guess:
    """What followed the latest earlier occurrence of the context's last `matched` tokens, and how
    many of the `occurrences` weighed (the latest, at most OCCURRENCES) went on as
    `drafts[:j + 1]` does (`agreeing[j]`)."""

    drafts: list[int]
    matched: int
    occurrences: int
    agreeing: list[int]

    def likely(self, j: int) -> float:
        """How likely the first j + 1 drafts are all right, by the text alone: the share of the
        occurrences that went on so, one more counted that did not (one occurrence: a half)."""
        return self.agreeing[j] / (self.occurrences + 1)


def guesses(
    context: Sequence[int], k: int, min_n: int = MIN_MATCH, max_n: int = MAX_MATCH
) -> list[Guess]:
    """For each suffix of the context of `max_n` down to `min_n` tokens that occurred earlier, up
    to `k` drafts and their support (longest first). A byte search over the ids (C speed: the
    occurrences of 7 suffixes in a 1,024-token window take ~30-100 us in all)."""
    n_ctx = len(context)
    if k <= 0 or n_ctx <= min_n:
        return []
    hay = array("i", context).tobytes()
    last_start = len(hay) - 4  # an occurrence must end before the last token: something follows
    found: list[Guess] = []
    for n in range(min(max_n, n_ctx - 1), min_n - 1, -1):
        pattern = hay[-4 * n :]
        end, starts = last_start, list[int]()
        while len(starts) < OCCURRENCES:
            at = hay.rfind(pattern, 0, end)
            if at < 0:
                break
            if at % 4 == 0:  # on a token's boundary, not inside two
                starts.append(at // 4 + n)
            end = at + len(pattern) - 1
        if not starts or (found and len(starts) == found[-1].occurrences < OCCURRENCES):
            continue  # none, or where the longer suffix occurred: the same guess again
        drafts = list(context[starts[0] : starts[0] + k])
        agreeing = [0] * len(drafts)
        for start in starts:
            for j, token in enumerate(drafts):
                if start + j >= n_ctx or context[start + j] != token:
                    break
                agreeing[j] += 1
        found.append(Guess(drafts, n, len(starts), agreeing))
    return found


class DecodeCosts:
    """What a pass of one sequence costs by the rows it carries, relative to one row: a prior
    until measured (`observe`), then a running mean of the measured times. Engine-wide."""

    def __init__(self, prior_per_row: float = 0.45, max_rows: int = 17) -> None:
        self.prior_per_row = prior_per_row
        self._seconds: list[float | None] = [None] * (max_rows + 1)  # running means, by rows
        self._measured = [0] * (max_rows + 1)  # the passes in those means
        self._per_row: float | None = None
        self._seen = [0] * (max_rows + 1)  # every pass and its seconds, by rows (for metrics)
        self._total = [0.0] * (max_rows + 1)
        self._rebuilt = 0  # one-row passes after a pass of another shape, their seconds ...
        self._rebuilt_total = 0.0
        self._rebuilt_seconds: float | None = None  # ... and their running mean

    def observe(self, rows: int, seconds: float, after: int = 1) -> None:
        """A pass of `rows` rows took `seconds`; `after`: the rows of the engine's pass before
        it. llama.cpp reuses its graph for a pass of the last one's shape and builds it anew
        for another: a one-row pass after a verification's (or a prefill's) is kept apart, and
        what it costs beyond a one-row pass after one is charged to the pass before (`switch`)."""
        if not 0 < rows < len(self._seconds):
            return
        self._seen[rows] += 1
        self._total[rows] += seconds
        if rows == 1 and after != 1:
            self._rebuilt += 1
            self._rebuilt_total += seconds
            self._rebuilt_seconds = _running(self._rebuilt_seconds, seconds, self._rebuilt)
            return
        self._measured[rows] += 1
        self._seconds[rows] = _running(self._seconds[rows], seconds, self._measured[rows])
        self._per_row = None  # derived from the measured passes: again at its next use

    def totals(self) -> dict[int, tuple[int, float]]:
        """Passes measured and their seconds, by rows."""
        return {rows: (n, self._total[rows]) for rows, n in enumerate(self._seen) if n}

    def rebuilt(self) -> tuple[int, float]:
        """Of the one-row passes in `totals`, those after a pass of another shape, and their
        seconds."""
        return self._rebuilt, self._rebuilt_total

    def switch(self) -> float:
        """What a one-row pass after a pass of another shape costs beyond one after a one-row
        pass, of a one-row pass (measured 3 times each, else 0): the graph a verification
        makes the next pass build again (~0.9 ms, 0.13 of a token, on this repository's CPU)."""
        one, rebuilt = self._seconds[1], self._rebuilt_seconds
        if not one or not rebuilt or self._measured[1] < 3 or self._rebuilt < 3:
            return 0.0
        return max(0.0, rebuilt / one - 1.0)

    def per_row(self) -> float:
        """What a row past the first adds to a pass, of a one-row pass: the mean of what the
        lengths measured so far show (a length not yet measured costs what they say, not the
        prior: on a compute-bound CPU a row costs ~0.8, twice the prior), else the prior."""
        if self._per_row is None:
            self._per_row = self._measured_per_row()
        return self._per_row

    def _measured_per_row(self) -> float:
        one = self._seconds[1]
        if not one or self._measured[1] < 3:
            return self.prior_per_row
        slopes = [
            (seconds / one - 1.0) / (rows - 1)
            for rows, seconds in enumerate(self._seconds)
            if rows >= 2 and seconds and self._measured[rows] >= 3
        ]
        return max(0.0, sum(slopes) / len(slopes)) if slopes else self.prior_per_row

    def ratio(self, rows: int, sequences: int = 1) -> float:
        """Cost of a pass where each of `sequences` sequences carries `rows` rows over the same
        pass with one row each. One sequence: measured (both at least 3 times), else the prior.
        Several: a pass is a fixed part and a part per row, the split one sequence's two-row pass
        shows; so the more sequences share a step, the more a draft's row costs against it. Either
        way with the graph it makes the next pass build again (`switch`)."""
        rows = min(rows, len(self._seconds) - 1)
        if rows <= 1:
            return 1.0
        if sequences <= 1:
            one, many = self._seconds[1], self._seconds[rows]
            if one and many and self._measured[1] >= 3 and self._measured[rows] >= 3:
                return max(1.0, many / one) + self.switch()
            return 1.0 + self.per_row() * (rows - 1) + self.switch()
        per_row = min(1.0, self.ratio(2) - 1.0 - self.switch())  # of a one-row pass
        fixed = 1.0 - per_row
        return (fixed + per_row * sequences * rows) / (fixed + per_row * sequences) + self.switch()


class DraftControl:
    """One session's drafting: how far its drafts are taken against what the text predicted
    (`trust`), the guess and length that pay, and the probes where none does. Rejections are
    learnt fast (the prior weighs TRUST_PRIOR expected tokens), so a stream whose drafts are
    rejected pays for a few of them, then only for probes that grow rarer; a new session's drafts
    grow longer as they are taken (SLOW_START), so that its first rejection costs two rows."""

    def __init__(self, max_drafts: int) -> None:
        self.max_drafts = max_drafts
        # by SUPPORT class: drafts taken, and the text's expectation of them, decayed
        self._taken = [TRUST_PRIOR] * len(SUPPORT)
        self._expected = [TRUST_PRIOR] * len(SUPPORT)
        self._chosen: list[float] = []  # the expected tokens of the drafts last chosen, by length
        self._chosen_support = 0  # ... and their guess's SUPPORT class
        self.since_draft = 0  # tokens decoded since its last verification
        self.probe_every = PROBE_EVERY
        self.probing = False  # the last drafts are a probe's
        self.drafted = 0
        self.accepted = 0

    @property
    def trust(self) -> float:
        """How far this session's best-trusted drafts are taken as its text predicts them."""
        return max(self.trust_of(c) for c in range(len(SUPPORT)))

    def trust_of(self, support: int) -> float:
        """How far drafts of a SUPPORT class are taken as the text predicts them (at most 1)."""
        return min(1.0, self._taken[support] / self._expected[support])

    def choose(self, costs: DecodeCosts, found: Sequence[Guess], sequences: int = 1) -> list[int]:
        """The drafts to verify with the next token ([]: none), in a step where `sequences`
        sessions decode: of every guess and length, the one with the most expected tokens
        per cost, if it pays MIN_GAIN; else a one-token probe once `probe_every` tokens went
        without one, where the text's occurrences all agree on it (`probing`)."""
        best_gain = MIN_GAIN
        best: tuple[Guess | None, int] = (None, 0)
        longest = min(self.max_drafts, SLOW_START + self.accepted)
        for guess in found:
            trust = self.trust_of(_support(guess))
            expected = 1.0  # tokens a pass yields: the pending one, then each draft if taken
            for j in range(min(longest, len(guess.drafts))):
                expected += trust * guess.likely(j)
                gain = expected / costs.ratio(j + 2, sequences)
                if gain > best_gain:
                    best, best_gain = (guess, j + 1), gain
        chosen, k = best
        self.probing = chosen is None
        if chosen is None:
            sure = [c for c in found if c.occurrences >= 2 and c.agreeing[0] == c.occurrences]
            if not (self.max_drafts and sure and self.since_draft >= self.probe_every):
                return []
            chosen, k = sure[0], 1
        self._chosen = [chosen.likely(j) for j in range(k)]
        self._chosen_support = _support(chosen)
        return chosen.drafts[:k]

    def worth_looking(self, costs: DecodeCosts, sequences: int = 1) -> bool:
        """Whether a lookup could lead to drafts now: a probe is due, or drafts the text agrees on
        wholly would pay at this session's trust. Where not, the session skips the lookup (a list
        of its tokens and a byte search, each token) as well as the drafts."""
        if not self.max_drafts:
            return False
        if self.since_draft >= self.probe_every:
            return True
        sure = max(self.trust_of(c) * n / (n + 1) for c, n in enumerate(SUPPORT_MOST))
        return any(
            (1.0 + sure * k) / costs.ratio(k + 1, sequences) > MIN_GAIN
            for k in range(1, self.max_drafts + 1)
        )

    def observe(self, drafted: int, accepted: int) -> None:
        """A verification of `drafted` tokens (the first of those last chosen) accepted the first
        `accepted`."""
        if drafted <= 0:
            return
        self.drafted += drafted
        self.accepted += accepted
        self.since_draft = 0
        if self.probing and accepted:  # the text is followed again: trusted as at the start
            self.probe_every = PROBE_EVERY
            self._taken = [TRUST_PRIOR] * len(SUPPORT)
            self._expected = [TRUST_PRIOR] * len(SUPPORT)
            return
        if self.probing:  # a probe rejected: the next comes twice as late
            self.probe_every = min(2 * self.probe_every, PROBE_MAX)
        c = self._chosen_support
        self._taken[c] = TRUST_DECAY * self._taken[c] + accepted
        self._expected[c] = TRUST_DECAY * self._expected[c] + sum(self._chosen[:drafted])

    def skipped(self) -> None:
        """A token decoded without drafts."""
        self.since_draft += 1


def _support(guess: Guess) -> int:
    """The guess's SUPPORT class: how many occurrences back it."""
    return max(c for c, least in enumerate(SUPPORT) if guess.occurrences >= least)


def _running(mean: float | None, seconds: float, n: int) -> float:
    """A mean of the first 20 values, then a moving one (the machine's speed drifts)."""
    return seconds if mean is None else mean + max(0.05, 1.0 / n) * (seconds - mean)
