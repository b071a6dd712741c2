"""Is each sentence of a narration supported by the facts and the lines they cite?

A sentence's claims are its numbers (digits or number words), its identifiers (tokens with digits
or inner punctuation: hosts, paths, ids), its names (capitalised or upper-case words after the
first) and its content words. Every number, identifier and name must appear in the support (the
words of the facts and of the lines they cite, compared without case; an identifier may also be
made of parts that all appear); content words are looser, since a narration needs verbs of its
own, they may also be narration words ("log", "repeated", "appeared"); any other word of four
letters or more that appears nowhere in the lines fails the sentence. A sentence must also say
something: at least four words, one of them a number, identifier, name or word of the lines, and
where sinkd wrote its opening (`lead`: "In lines 1-200, the log shows"), one of them after it. A
sentence that repeats itself ("the log of the log of the log") says nothing, whatever its words.
A failing sentence is dropped, never mended: the facts stand alone.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

_SPLIT = re.compile(r"(?<=[.!?])\s+")
_PARTS = re.compile(r"[A-Za-z0-9]+")
_DIGIT = re.compile(r"\d")
_INNER = re.compile(r"[A-Za-z0-9][/_.:@=\-][A-Za-z0-9]")
_THOUSANDS = re.compile(r"^\d{1,3}(?:,\d{3})+$")
_OUTER = "\"'`()[]{}<>,;:!?.*"
NUMBER_WORDS = {
    w: i
    for i, w in enumerate(
        "zero _ two three four five six seven eight nine ten eleven twelve thirteen fourteen"
        " fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
    if w != "_"
}
MAGNITUDES = {"dozens": 24, "hundreds": 200, "thousands": 2000, "millions": 2_000_000}
STOPWORDS = frozenset(
    """a an the and or but if then than that this these those there their they them it its
    is are was were be been being has have had do does did of in on at to from by for with without
    as into onto over under about after before during between within while when where which who
    whom what why how all any each every some no not only also again more most less few many much
    one both either neither such same other another so very can could will would should may might
    must just still yet up down out off own i we you he she his her our your my me us""".split()
)
# the words a narration needs that a log line may not hold
NARRATION_WORDS = frozenset(
    """log logs logged line lines entry entries message messages event events record records
    recorded kind kinds type types template templates error errors warning warnings new
    appear appeared appears appearing occur occurred occurs occurring show shows showed shown
    report reports reported repeat repeated repeats repeating time times first last since start
    started starts stop stopped stops again usual usually steady silent silence second seconds
    minute minutes burst bursts rate rates rise rose increase increased frequent frequently
    total count counted counts number several multiple range period interval stream ongoing
    continue continued continues issue issues problem problems indicate indicates indicating
    note noted seen following followed system operator there here recent recently latest
    earlier later while series together mostly mainly across""".split()
)


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def words_of(text: str) -> set[str]:
    """The forms a claim is looked up by: each token without case or outer punctuation, its
    alphanumeric parts, a number without thousands separators, and the stems of words."""
    out: set[str] = set()
    for raw in text.split():
        token = raw.strip(_OUTER).lower()
        if not token:
            continue
        out.add(token)
        if _THOUSANDS.match(token):
            out.add(token.replace(",", ""))
        for part in _PARTS.findall(token):
            out.add(part)
            out.add(_stem(part))
            if part.isdigit():
                out.add(str(int(part)))
    return out


@dataclass(frozen=True)
class Dropped:
    sentence: str
    unsupported: tuple[str, ...]  # the claims the support lacks


@dataclass(frozen=True)
class Checked:
    kept: tuple[str, ...]
    dropped: tuple[Dropped, ...]

    @property
    def text(self) -> str:
        return " ".join(self.kept)


def sentences_of(text: str) -> list[str]:
    return [s.strip() for s in _SPLIT.split(" ".join(text.split())) if s.strip()]


def check(text: str, support: frozenset[str] | set[str], lead: str = "") -> Checked:
    """Each sentence kept or dropped. `lead`: the opening sinkd wrote before the model's words,
    true by construction: what a sentence says must come after it."""
    kept, dropped = [], []
    numbers = [int(w) for w in support if w.isdigit()]
    for sentence in sentences_of(text):
        if repeats_itself(sentence):
            missing = [REPEATS]
        elif lead and sentence.startswith(lead):
            missing = unsupported_claims(sentence[len(lead) :], support, numbers, min_words=1)
        else:
            missing = unsupported_claims(sentence, support, numbers)
        if missing:
            dropped.append(Dropped(sentence, tuple(missing)))
        else:
            kept.append(sentence)
    return Checked(tuple(kept), tuple(dropped))


REPEATS = "(repeats itself)"
SAYS_NOTHING = "(says nothing of the lines)"


def repeats_itself(sentence: str) -> bool:
    """Two or three words said three times over, not all of them stop words: a model looping
    ("the log of the log of the log"), not describing ("two errors on db-07 and two errors on
    db-09" says a pair twice)."""
    words = [w for w in (raw.strip(_OUTER).lower() for raw in sentence.split()) if w]
    for n in (2, 3):
        runs = Counter(zip(*(words[i:] for i in range(n)), strict=False))
        if any(times >= 3 and not set(run) <= STOPWORDS for run, times in runs.items()):
            return True
    return False


def unsupported_claims(
    sentence: str,
    support: frozenset[str] | set[str],
    numbers: list[int] | None = None,
    min_words: int = 4,
) -> list[str]:
    if numbers is None:
        numbers = [int(w) for w in support if w.isdigit()]
    strict: list[str] = []
    specific = 0  # claims the support holds: the sentence says something of the lines
    words = sentence.split()
    for raw in words:
        token = raw.strip(_OUTER)
        if not token:
            continue
        lower = token.lower()
        if _THOUSANDS.match(lower):
            lower = lower.replace(",", "")
        if _DIGIT.search(token) or _INNER.search(token):
            ok = _known(lower, support)
        elif lower in NUMBER_WORDS:
            ok = str(NUMBER_WORDS[lower]) in support
        elif lower in MAGNITUDES:
            ok = any(n >= MAGNITUDES[lower] // 2 for n in numbers)
        elif _free(lower, token):
            continue
        else:
            ok = lower in support or _stem(lower) in support
        if ok:
            specific += 1
        else:
            strict.append(token)
    if not strict and (len(words) < min_words or specific == 0):
        strict.append(SAYS_NOTHING)
    return strict


def _free(lower: str, token: str) -> bool:
    """Words a sentence may use without the lines: short ones, stop words, narration words."""
    short = len(lower) < 4 and not token.isupper()
    return (
        short or lower in STOPWORDS or lower in NARRATION_WORDS or _stem(lower) in NARRATION_WORDS
    )


def _known(token: str, support: frozenset[str] | set[str]) -> bool:
    if token in support:
        return True
    parts = _PARTS.findall(token)
    return bool(parts) and all(_part_known(p, support) for p in parts)


def _part_known(part: str, support: frozenset[str] | set[str]) -> bool:
    return part in support or (part.isdigit() and str(int(part)) in support)
