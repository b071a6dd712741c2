"""The rules sinkd adds to llama-cpp-python's schema converter (integer ranges, number bounds,
OpenAI's formats), read as regular expressions: each allows only values its keyword allows, and the
values a model would write; and the check after generation that catches what they do not hold."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sinkd.daemon.engine import schema_rules
from sinkd.daemon.engine.schema_rules import Bounds
from sinkd.daemon.engine.schemas import check_reply, violation
from sinkd.errors import SchemaUnmet

pytestmark = pytest.mark.unit


def as_regex(rule: str) -> re.Pattern[str]:
    """The rules use literals, classes, groups, alternatives and bounded repeats only."""
    text = re.sub(r'"([^"]*)"', lambda m: re.escape(m[1]), rule).replace(" ", "")
    return re.compile(text)


RANGES = [
    (0, 150), (1, 9), (18, 65), (-40, 120), (-999, -10), (7, 7), (0, 0), (100, 1000),
    (0, None), (5, None), (123, None), (-3, None), (None, 0), (None, 42), (None, -17), (-1, 1),
]  # fmt: skip


@pytest.mark.parametrize(("lo", "hi"), RANGES)
def test_an_integer_range_allows_its_integers_and_no_other(lo: int | None, hi: int | None) -> None:
    pattern = as_regex(schema_rules.integer_range(lo, hi))
    for n in range(-1300, 1300):
        inside = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert bool(pattern.fullmatch(str(n))) == inside, n
    for odd in ("-0", "007", "01", "+1", "1.0", "1e3"):
        assert not pattern.fullmatch(odd), odd
    if hi is None:  # unbounded: as many digits as the converter's own integers
        assert pattern.fullmatch("9" * schema_rules.MAX_DIGITS)
        assert not pattern.fullmatch("9" * (schema_rules.MAX_DIGITS + 1))


def test_an_empty_integer_range_is_refused() -> None:
    with pytest.raises(ValueError, match="no integer"):
        schema_rules.integer_range(5, 4)


def test_integer_bounds_read_every_keyword() -> None:
    assert schema_rules.integer_bounds({"minimum": 0, "maximum": 150}) == (0, 150)
    assert schema_rules.integer_bounds({"exclusiveMinimum": 0, "exclusiveMaximum": 10}) == (1, 9)
    assert schema_rules.integer_bounds({"minimum": 0.5, "maximum": 9.5}) == (1, 9)
    assert schema_rules.integer_bounds({"minimum": 3, "exclusiveMinimum": 4}) == (5, None)


NUMBER_BOUNDS = [
    Bounds(0, True, 1, True), Bounds(0, False, 150, False), Bounds(-1, False, 1, False),
    Bounds(-10.5, False, -2.25, False), Bounds(2.5, False), Bounds(hi=0), Bounds(hi=0, hi_open=True),
    Bounds(0.5, True, 9.75, True), Bounds(3, False, 3, False), Bounds(1, True, 2, False),
]  # fmt: skip


@pytest.mark.parametrize("bounds", NUMBER_BOUNDS, ids=str)
def test_a_number_range_allows_its_values_and_few_others(bounds: Bounds) -> None:
    """Every value of two decimals in the bounds is allowed; outside them only within a unit of
    a bound that is not a whole number at or above 0 (there the rule is exact)."""
    pattern = as_regex(schema_rules.number_range(bounds))
    exact = [
        bound for bound in (bounds.lo, bounds.hi)
        if bound is not None and bound >= 0 and bound == int(bound)
    ]  # fmt: skip
    for hundredths in range(-2000, 20000, 7):
        value = Decimal(hundredths) / 100
        text = f"{value:.2f}"
        if bounds.holds(value):
            assert pattern.fullmatch(text), text
        elif pattern.fullmatch(text):
            near = [
                bound for bound in (bounds.lo, bounds.hi)
                if bound is not None and abs(value - Decimal(str(bound))) < 1
            ]  # fmt: skip
            assert near and not set(near) <= set(exact), text
    for odd in ("1e3", "01.5", "+1", ".5"):
        assert not pattern.fullmatch(odd), odd


def test_the_tightest_bound_wins() -> None:
    assert schema_rules.number_bounds({"minimum": 0, "exclusiveMinimum": 0}) == Bounds(0, True)
    assert schema_rules.number_bounds({"maximum": 5, "exclusiveMaximum": 6}) == Bounds(hi=5)
    assert Bounds(3, True, 3, False).empty() and not Bounds(3, False, 3, False).empty()


def test_few_multiples_are_listed_exactly() -> None:
    assert schema_rules.multiples(Bounds(0, False, 20, False), 2) == [
        str(n) for n in range(0, 21, 2)
    ]
    halves = schema_rules.multiples(Bounds(0, False, 5, False), 0.5)
    assert halves == ["0", "0.5", "1", "1.5", "2", "2.5", "3", "3.5", "4", "4.5", "5"]
    assert schema_rules.multiples(Bounds(0, True, 1, True), 0.25) == ["0.25", "0.5", "0.75"]
    assert schema_rules.multiples(Bounds(0, False), 2) is None  # open: checked after generation
    assert schema_rules.multiples(Bounds(0, False, 10_000, False), 3) is None  # too many


FORMAT_EXAMPLES = {
    "date": (["2024-02-28", "1999-12-31", "2026-04-30"], ["2024-02-30", "2024-13-01", "24-01-01"]),
    "time": (["12:30:00Z", "23:59:59.123+02:00"], ["24:00:00Z", "12:30:00", "12:60:00Z"]),
    "date-time": (["2026-12-05T22:39:25Z"], ["2026-12-05 22:39:25Z", "2026-12-05"]),
    "duration": (["P3D", "PT1H30M", "P1Y2M3DT4H5M6S", "P2W"], ["P", "PT", "P1H", "1D", "P1DT"]),
    "email": (["ada@example.com", "a.b+c@mail.example.org"], ["ada@", "@x.com", "a..b@x.com"]),
    "hostname": (["example.com", "a-b.c", "localhost"], ["-a.com", "a-.com", "a..b", "a_b"]),
    "ipv4": (["192.168.0.1", "0.0.0.0", "255.255.255.255"], ["256.1.1.1", "1.2.3", "01.2.3.4"]),
    "ipv6": (
        ["::1", "fe80::1", "2001:db8::8a2e:370:7334", "1:2:3:4:5:6:7:8", "::"],
        ["1:2", ":::"],
    ),
    "uuid": (["123e4567-e89b-12d3-a456-426614174000"], ["123e4567e89b12d3a456426614174000"]),
}


@pytest.mark.parametrize("form", sorted(schema_rules.FORMATS))
def test_a_format_rule_takes_its_examples_and_refuses_the_rest(form: str) -> None:
    pattern = as_regex(schema_rules.FORMATS[form])
    good, bad = FORMAT_EXAMPLES[form]
    for text in good:
        assert pattern.fullmatch(text), text
        assert violation({"type": "string", "format": form}, f'"{text}"') is None, text
    for text in bad:
        assert not pattern.fullmatch(text), text
        assert violation({"type": "string", "format": form}, f'"{text}"') is not None, text


@pytest.mark.parametrize("form", sorted(schema_rules.FORMATS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_whatever_a_format_rule_allows_is_valid(form: str, data: st.DataObject) -> None:
    """Soundness: a string the grammar lets a model write passes the check (Python's own date and
    ipaddress parsers among it)."""
    text = data.draw(st.from_regex(as_regex(schema_rules.FORMATS[form]), fullmatch=True))
    if form == "hostname" and len(text) > 253:  # length: the check's, not the grammar's
        return
    found = violation({"type": "string", "format": form}, f'"{text}"')
    if form in ("hostname", "email") and found is not None:  # lengths: the check's alone
        local = text.split("@")[0] if form == "email" else ""
        labels = re.split(r"[.@]", text)
        assert len(local) > 64 or any(len(label) > 63 for label in labels), text
        return
    assert found is None, (text, found)


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "score": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "step": {"type": "number", "multipleOf": 0.25},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
        "ref": {"$ref": "#/$defs/Ref"},
    },
    "required": ["score"],
    "additionalProperties": False,
    "$defs": {"Ref": {"type": "string", "pattern": "^[A-Z]{2}-\\d+$"}},
}


@pytest.mark.parametrize(
    ("reply", "named"),
    [
        ('{"score": 0.5, "step": 1.75, "tags": ["a"], "ref": "AB-12"}', None),
        ('{"score": 1.0}', "$.score: 1.0 breaks exclusiveMaximum 1"),
        ('{"score": 0}', "$.score: 0 breaks exclusiveMinimum 0"),
        ('{"score": 0.5, "step": 0.3}', "$.step: 0.3 breaks multipleOf 0.25"),
        ('{"score": 0.5, "tags": []}', "$.tags: fewer items than minItems 1"),
        ('{"score": 0.5, "tags": ["a", "b", "c"]}', "$.tags: more items than maxItems 2"),
        ('{"score": 0.5, "ref": "ab-1"}', "$.ref: does not match its pattern"),
        ('{"score": 0.5, "other": 1}', "'other' is not among its properties"),
        ('{"step": 1}', "lacks required 'score'"),
        ('{"score": 0.5', "not one JSON value"),
    ],
)
def test_the_check_after_generation_names_the_keyword(reply: str, named: str | None) -> None:
    assert violation(SCHEMA, reply) == (None if named is None else violation(SCHEMA, reply))
    if named is None:
        check_reply(SCHEMA, reply)
    else:
        with pytest.raises(SchemaUnmet, match=re.escape(named)):
            check_reply(SCHEMA, reply)


@pytest.mark.parametrize("form", ["hostname", "email"])
@pytest.mark.parametrize("limit", [6, 8, 24, 80])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_format_beside_max_length_stays_within_it(
    form: str, limit: int, data: st.DataObject
) -> None:
    rule = as_regex(schema_rules.format_rule(form, limit))
    text = data.draw(st.from_regex(rule, fullmatch=True))
    schema = {"type": "string", "format": form, "maxLength": limit}
    assert violation(schema, f'"{text}"') is None, text


def _inlined(rules: dict[str, str], name: str) -> str:
    """A rule of `string_except` as a regular expression (its rules reference each other without
    a cycle, so every reference is inlined)."""
    out = []
    for token in re.findall(
        r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|\{\d*,\d*\}|\||[\w-]+', rules[name]
    ):
        if token.startswith('"'):
            out.append(re.escape(json.loads(token)))
        elif token.startswith("[") or token.startswith("{") or token == "|":
            out.append(token)
        elif token == "char":
            out.append(r'(?:[^"\\\x7F\x00-\x1F]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))')
        else:
            out.append(f"(?:{_inlined(rules, token)})")
    return "".join(out)


EXCLUDED = ["tag1", "tag2", "Tag1", "Suggested next message 1", "a/b", "x\ny", "ab"]
BEGINNINGS = ("Sugg", "tag", "x\n")


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.sampled_from(EXCLUDED),
        st.sampled_from(EXCLUDED).map(lambda s: s[:-1]),
        st.sampled_from(EXCLUDED).map(lambda s: s + "!"),
        st.text(alphabet='tag12Sx/\n"\\ b', max_size=9),
    ),
    st.sampled_from([(0, None), (1, 8), (0, 4), (3, 30)]),
)
def test_a_string_except_allows_every_other_string_in_its_bounds_and_none_excluded(
    value: str, bounds: tuple[int, int | None]
) -> None:
    low, high = bounds
    for beginnings in ((), BEGINNINGS):
        rules = schema_rules.string_except("s", EXCLUDED, low, high, beginnings)
        rules["char"] = "char"
        pattern = re.compile(_inlined(rules, "s-x0"), re.DOTALL)
        written = json.dumps(value, ensure_ascii=False)[1:]  # after the opening quote
        allowed = (
            value not in EXCLUDED
            and not value.startswith(beginnings)
            and low <= len(value) <= (high if high is not None else 99)
        )
        assert bool(pattern.fullmatch(written)) is allowed


def test_not_an_enum_is_the_only_not_and_only_on_a_string() -> None:
    from sinkd.daemon.engine.grammar import UnsupportedSchema, schema_grammar

    assert "root-s-x0" in schema_grammar({"type": "string", "not": {"enum": ["x"]}})
    either = {"anyOf": [{"enum": ["x"]}, {"pattern": "^(?:ab|c\\ d)"}]}
    assert "root-s-x0" in schema_grammar({"type": "string", "not": either})
    assert violation({"type": "string", "not": either}, '"c dx"') is not None
    for schema in (
        {"type": "integer", "not": {"enum": [1]}},
        {"type": "string", "not": {"const": "x"}},
        {"type": "string", "pattern": "a+", "not": {"enum": ["a"]}},
        {"type": "string", "not": {"enum": [1]}},
        {"type": "string", "not": {"pattern": "^(?:a.*)"}},  # a pattern, not a literal
        {"type": "string", "not": {"pattern": "a"}},
        {"type": "string", "anyOf": [{"minLength": 2}], "not": {"enum": ["a"]}},  # not dropped
        {"type": "string", "not": {"anyOf": [{"anyOf": [{"enum": ["a"]}]}]}},
    ):
        with pytest.raises(UnsupportedSchema, match="'not'"):
            schema_grammar(schema)
    assert violation({"type": "string", "not": {"enum": ["x"]}}, '"x"') is not None
    assert violation({"type": "string", "not": {"enum": ["x"]}}, '"y"') is None
