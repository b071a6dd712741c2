"""GBNF for what llama-cpp-python's schema converter leaves out: integer ranges, number bounds and
OpenAI's string formats. Pure text: each rule's language is a subset of the values the keyword
allows (never a value it forbids), and `schemas.violation` checks the reply after generation for
what a grammar cannot say exactly (a float's bounds, `multipleOf`, a hostname's length).

Integer ranges follow llama.cpp's `build_min_max_int` (common/json-schema-to-grammar.cpp): the
range is split by digit count, and each equal-length part digit by digit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

MAX_DIGITS = 16  # as the converter's `integral-part`: a JSON integer of at most 16 digits
FRACTION = '("." [0-9]{1,15})?'


def _equal_length(lo: str, hi: str) -> str:
    """Digit strings of one length from `lo` to `hi` (leading zeros allowed: a suffix)."""
    if len(lo) == 1:
        return f"[{lo}-{hi}]" if lo != hi else f'"{lo}"'
    rest = len(lo) - 1
    if lo[0] == hi[0]:
        return f'"{lo[0]}" ({_equal_length(lo[1:], hi[1:])})'
    if lo[1:] == "0" * rest and hi[1:] == "9" * rest:
        return f"[{lo[0]}-{hi[0]}] [0-9]{{{rest}}}"
    parts = [f'"{lo[0]}" ({_equal_length(lo[1:], "9" * rest)})']
    if int(hi[0]) - int(lo[0]) > 1:
        parts.append(f"[{int(lo[0]) + 1}-{int(hi[0]) - 1}] [0-9]{{{rest}}}")
    parts.append(f'"{hi[0]}" ({_equal_length("0" * rest, hi[1:])})')
    return " | ".join(parts)


def _naturals(lo: int, hi: int | None) -> str:
    """Decimal naturals (no leading zero) from `lo` to `hi` (None: up to MAX_DIGITS digits)."""
    parts = []
    width = len(str(lo))
    top = MAX_DIGITS if hi is None else len(str(hi))
    for digits in range(width, top + 1):
        first = lo if digits == width else 10 ** (digits - 1)
        last = 10**digits - 1 if hi is None or digits < top else hi
        if first > last:
            continue
        if hi is None and digits > width:  # every number of these widths: one rule
            parts.append(f"[1-9] [0-9]{{{digits - 1},{MAX_DIGITS - 1}}}")
            break
        parts.append(_equal_length(str(first), str(last)))
    return " | ".join(f"({p})" for p in parts)


def integer_range(lo: int | None, hi: int | None) -> str:
    """A JSON integer in [lo, hi] (None: unbounded), never `-0`. ValueError when empty."""
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"no integer lies in [{lo}, {hi}]")
    parts = []
    if lo is None or lo < 0:  # the negatives: "-" and a magnitude from max(1, -hi) to -lo
        top = None if lo is None else -lo
        parts.append(f'"-" ({_naturals(max(1, -hi) if hi is not None else 1, top)})')
    if hi is None or hi >= 0:
        parts.append(_naturals(max(0, lo) if lo is not None else 0, hi))
    return " | ".join(f"({p})" for p in parts)


def integer_bounds(schema: dict[str, object]) -> tuple[int | None, int | None]:
    """The inclusive integer bounds of an integer schema's minimum/maximum/exclusive* keywords."""
    lows = [math.ceil(v) for v in _bounds(schema, "minimum")]
    lows += [math.floor(v) + 1 for v in _bounds(schema, "exclusiveMinimum")]
    highs = [math.floor(v) for v in _bounds(schema, "maximum")]
    highs += [math.ceil(v) - 1 for v in _bounds(schema, "exclusiveMaximum")]
    return (max(lows) if lows else None), (min(highs) if highs else None)


@dataclass(frozen=True)
class Bounds:
    """A number schema's tightest bound on each side (None: open), and whether it is exclusive."""

    lo: float | None = None
    lo_open: bool = False
    hi: float | None = None
    hi_open: bool = False

    def empty(self) -> bool:
        if self.lo is None or self.hi is None:
            return False
        return self.lo > self.hi or (self.lo == self.hi and (self.lo_open or self.hi_open))

    def holds(self, value: Decimal) -> bool:
        lo = None if self.lo is None else Decimal(str(self.lo))
        hi = None if self.hi is None else Decimal(str(self.hi))
        above = lo is None or value > lo or (value == lo and not self.lo_open)
        below = hi is None or value < hi or (value == hi and not self.hi_open)
        return above and below


def number_bounds(schema: dict[str, object]) -> Bounds:
    lo, lo_open, hi, hi_open = None, False, None, False
    for value, is_open in [(v, False) for v in _bounds(schema, "minimum")] + [
        (v, True) for v in _bounds(schema, "exclusiveMinimum")
    ]:
        if lo is None or value > lo or (value == lo and is_open):
            lo, lo_open = value, is_open
    for value, is_open in [(v, False) for v in _bounds(schema, "maximum")] + [
        (v, True) for v in _bounds(schema, "exclusiveMaximum")
    ]:
        if hi is None or value < hi or (value == hi and is_open):
            hi, hi_open = value, is_open
    return Bounds(lo, lo_open, hi, hi_open)


def number_range(b: Bounds) -> str:
    """JSON numbers (no exponent) within `b`, exactly where its bounds are whole numbers at or
    above 0 (`gt=0, lt=1`, `ge=0, le=5`); elsewhere a superset within a unit of a bound, which
    the check after generation closes."""
    parts = []
    if b.lo is None or b.lo < 0:  # negatives: magnitudes from max(0, -hi) to -lo
        small = 0 if b.hi is None or b.hi >= 0 else math.floor(-b.hi)
        large = None if b.lo is None else math.floor(-b.lo)
        parts.append(f'"-" ({_naturals(small, large)}) {FRACTION}')
    if b.hi is None or b.hi > 0 or (b.hi == 0 and not b.hi_open):
        start = 0 if b.lo is None or b.lo < 0 else math.floor(b.lo)
        if b.lo is not None and b.lo >= 0 and b.lo == start and b.lo_open:  # gt=L: L.xx, not L
            parts.append(f'"{start}" "." "0"{{0,14}} [1-9] [0-9]{{0,14}}')
            start += 1
        if b.hi is not None and b.hi == math.floor(b.hi):  # le=H: up to H-1.xx, and H
            if not b.hi_open and b.hi >= start:
                parts.append(f'"{int(b.hi)}" ("." "0"{{1,15}})?')
            end: int | None = int(b.hi) - 1
        else:
            end = None if b.hi is None else math.floor(b.hi)
        if end is None or end >= start:
            parts.append(f"({_naturals(start, end)}) {FRACTION}")
    return " | ".join(f"({p})" for p in parts)


def multiples(b: Bounds, step: float, most: int = 256) -> list[str] | None:
    """Every multiple of `step` within `b`, as JSON writes it, where the bounds are closed on
    both sides and hold at most `most` of them (None otherwise)."""
    if b.lo is None or b.hi is None or step <= 0:
        return None
    unit = Decimal(str(step))
    first = math.ceil(Decimal(str(b.lo)) / unit)
    last = math.floor(Decimal(str(b.hi)) / unit)
    if last - first + 1 > most:
        return None
    values = (unit * k for k in range(first, last + 1))
    return [_plain(v) for v in values if b.holds(v)]


def _plain(value: Decimal) -> str:
    text = format(value.normalize(), "f")
    return "0" if text in ("-0", "0") else text


def _bounds(schema: dict[str, object], key: str) -> list[float]:
    value = schema.get(key)
    return [value] if isinstance(value, int | float) and not isinstance(value, bool) else []


_DAY_31 = '("0" [1-9] | [12] [0-9] | "3" [01])'
_DAY_30 = '("0" [1-9] | [12] [0-9] | "30")'
_DAY_28 = '("0" [1-9] | "1" [0-9] | "2" [0-8])'  # 29 February only in a leap year: left out
_DATE = (
    '[12] [0-9]{3} "-" (("0" [13578] | "1" [02]) "-" ' + _DAY_31 + ' | ("0" [469] | "11") "-" '
    + _DAY_30 + ' | "02-" ' + _DAY_28 + ")"
)  # fmt: skip
_TIME = (
    '([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})?'
    ' ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])'
)
_HEX = "[0-9a-f]"
# bounded as RFC 1123 bounds a label (63 characters, no "-" at either end); the counts of labels
# and atoms are bounded too, so a model that repeats itself must close the string
_LABEL = "[a-zA-Z0-9] ([a-zA-Z0-9-]{0,61} [a-zA-Z0-9])?"
_ATOM_CHAR = "[a-zA-Z0-9_%+-]"
_ATOM = _ATOM_CHAR + "{1,64}"
_OCTET = '("25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9])'
_DIGITS = "[0-9]{1,4}"  # a duration's counts: 9999 years is within what parsers take


def _ipv6() -> str:
    """Eight groups, or fewer around one "::" (lower-case hex, at most four digits a group)."""
    group = f"{_HEX}{{1,4}}"

    def run(n: int) -> str:
        return " ".join([group] + [f'":" {group}'] * (n - 1)) if n else ""

    forms = [run(8)]
    for left in range(8):
        for right in range(8 - left):
            forms.append(" ".join(p for p in (run(left), '"::"', run(right)) if p))
    return " | ".join(f"({f})" for f in forms)


def _duration() -> str:
    """RFC 3339's ISO 8601 duration (appendix A): P, then dates, times or weeks."""
    second = f'{_DIGITS} "S"'
    minute = f'{_DIGITS} "M" ({second})?'
    hour = f'{_DIGITS} "H" ({minute})?'
    time = f'"T" ({hour} | {minute} | {second})'
    day = f'{_DIGITS} "D"'
    month = f'{_DIGITS} "M" ({day})?'
    year = f'{_DIGITS} "Y" ({month})?'
    date = f"({day} | {month} | {year}) ({time})?"
    return f'"P" (({date}) | ({time}) | {_DIGITS} "W")'


# a format's value, inside the JSON string's quotes
FORMATS: dict[str, str] = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f'{_DATE} "T" {_TIME}',
    "duration": _duration(),
    "email": f'{_ATOM} ("." {_ATOM}){{0,3}} "@" {_LABEL} ("." {_LABEL}){{1,4}}',
    "hostname": f'{_LABEL} ("." {_LABEL}){{0,7}}',
    "ipv4": f'{_OCTET} ("." {_OCTET}){{3}}',
    "ipv6": _ipv6(),
    "uuid": ' "-" '.join(f"{_HEX}{{{n}}}" for n in (8, 4, 4, 4, 12)),
}


def format_rule(form: str, max_length: int | None = None) -> str:
    """A format's value; a hostname's or email's within `max_length` characters where one is set
    (the others are short by form), so a schema's `maxLength` beside its format holds too."""
    if max_length is None:
        return FORMATS[form]
    plain = "[a-zA-Z0-9]"
    if form == "hostname" and max_length >= 1:
        dots = 2 if max_length >= 8 else 0  # up to three labels
        k = min(63, (max_length - dots) // (dots + 1))
        return f'{plain}{{1,{k}}} ("." {plain}{{1,{k}}}){{0,{dots}}}'
    if form == "email" and max_length >= 6:  # local "@" label "." top, within the limit
        budget = max_length - 2
        top = min(6, max(2, budget // 4))
        label = min(63, max(1, (budget - top) // 2))
        local = min(64, budget - top - label)
        return f'{_ATOM_CHAR}{{1,{local}}} "@" {plain}{{1,{label}}} "." [a-zA-Z]{{2,{top}}}'
    return FORMATS[form]


MAX_EXCLUDED = 4096  # strings a `not: {enum}` may name
MAX_EXCLUDED_CHARS = 128 * 1024  # and their characters, together


def string_except(
    name: str,
    excluded: list[str],
    min_len: int,
    max_len: int | None,
    beginnings: tuple[str, ...] = (),
) -> dict[str, str]:
    """Rules for a JSON string (its quotes included) of `min_len` to `max_len` characters that is
    none of `excluded` and begins with none of `beginnings`: a state for each prefix the excluded
    strings share (a trie), where the string may end unless that prefix is excluded (and never
    goes on to a beginning's last character), and any other character leaves for a state that
    takes the rest freely. In the trie a character is written as itself or as one of JSON's
    short escapes (never `\\u`, which could spell an excluded character), so the language is
    exactly the strings allowed that start like an excluded one, plus all others. The string
    starts at `name-x0`, after its opening quote."""
    children: list[dict[str, int]] = [{}]
    ends = [False]
    blocked = [False]
    for text, whole in [*((t, True) for t in excluded), *((b, False) for b in beginnings)]:
        node = 0
        for ch in text:
            if ch not in children[node]:
                children[node][ch] = len(children)
                children.append({})
                ends.append(False)
                blocked.append(False)
            node = children[node][ch]
        if whole:
            ends[node] = True
        else:
            blocked[node] = True
    depth = [0] * len(children)
    for k, kids in enumerate(children):  # parents are numbered before their children
        for child in kids.values():
            depth[child] = depth[k] + 1
    top = max_len

    def free(j: int) -> str:
        least = max(0, min_len - j)
        most = "" if top is None else str(top - j)
        return f'char{{{least},{most}}} "\\""'

    rules: dict[str, str] = {}
    for k, kids in enumerate(children):
        d = depth[k]
        if blocked[k] or (top is not None and (d > top or (ends[k] and d >= top))):
            continue  # never reached: a beginning, past the length, or excluded at its end
        alts = []
        if not ends[k] and d >= min_len:
            alts.append('"\\""')
        if top is None or d + 1 <= top:
            for ch, child in kids.items():
                dead = blocked[child] or (ends[child] and top is not None and depth[child] >= top)
                if not dead:  # a state with no way on is never entered
                    alts += [f"{way} {name}-x{child}" for way in _written(ch)]
            taken = "".join(_code(ch) for ch in kids)
            alts.append(f'[^"\\\\\\x7F\\x00-\\x1F{taken}] {name}-f{d + 1}')
            shorts = "".join(_code(c) for c, meant in SHORT_ESCAPES.items() if meant not in kids)
            alts.append(f'"\\\\" [{shorts}] {name}-f{d + 1}')
            rules[f"{name}-f{d + 1}"] = free(d + 1)
        rules[f"{name}-x{k}"] = " | ".join(alts)
    return rules


# JSON's short escapes, and the character each one means
SHORT_ESCAPES = {
    '"': '"',
    "\\": "\\",
    "/": "/",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
}


def _written(ch: str) -> list[str]:
    """The ways JSON writes a character inside a string, short of `\\u`: itself, where it may
    stand raw, and its short escape, where it has one."""
    ways = []
    if ch not in '"\\' and ord(ch) >= 0x20 and ch != "\x7f":
        ways.append(f"[{_code(ch)}]")
    ways += [f'"\\\\" [{_code(c)}]' for c, meant in SHORT_ESCAPES.items() if meant == ch]
    return ways


def _code(ch: str) -> str:
    """A character as GBNF writes it inside a character class, whatever it is."""
    n = ord(ch)
    return f"\\u{n:04X}" if n <= 0xFFFF else f"\\U{n:08X}"
