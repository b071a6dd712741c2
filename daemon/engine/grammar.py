"""Structured output: a JSON schema (or "any JSON object") becomes a llama.cpp grammar that masks
each sampled token's logits, so a reply is always valid for it.

The schema goes through llama-cpp-python's own converter (`llama_grammar.SchemaConverter`, the
port of llama.cpp's `json-schema-to-grammar`), with what its port lacks added (`Converter`): integer
ranges, number bounds and OpenAI's string formats (`schema_rules`). What the grammar holds only in
part (a float's bounds, `multipleOf`) is checked after generation (`schemas.check_reply`). Keywords
outside OpenAI's structured-outputs subset are refused by name, with their path in the schema
(`UnsupportedSchema`): a schema accepted and not enforced would be a promise sinkd does not keep.
Annotations that constrain nothing (`title`, `description`, ...) are allowed.
"""

from __future__ import annotations

import ctypes
import json
import re
from collections.abc import Iterator
from typing import Any

import llama_cpp as llama
import numpy as np
from llama_cpp import llama_grammar

from sinkd.daemon.engine import schema_rules
from sinkd.errors import InvalidInput

# what the converter enforces, by the kind of schema that holds it
ENFORCED = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "items", "prefixItems",
        "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs",
        "definitions", "pattern", "format", "minLength", "maxLength", "minimum", "maximum",
        "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "not",
    }
)  # fmt: skip
ANNOTATIONS = frozenset(
    {
        "title", "description", "default", "examples", "$comment", "$schema", "$id",
        "deprecated", "readOnly", "writeOnly",
    }
)  # fmt: skip
FORMATS = frozenset(schema_rules.FORMATS)
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
MAX_SCHEMA_BYTES = 64 * 1024
# a JSON string's character, as llama.cpp's own converter writes it: llama-cpp-python's port
# (0.3.x) allows raw control characters (a newline) in strings, which no JSON parser accepts
JSON_CHAR = (
    r'char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F]'
    r" [0-9a-fA-F] [0-9a-fA-F])"
)


class UnsupportedSchema(InvalidInput):
    """A schema keyword (or value) the grammar cannot enforce; the message names it and where."""


def schema_grammar(schema: Any) -> str:
    """The GBNF grammar of a JSON schema, or UnsupportedSchema / InvalidInput saying why not."""
    if not isinstance(schema, dict):
        raise InvalidInput("the schema must be a JSON object")
    if len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
        raise InvalidInput(f"the schema is larger than {MAX_SCHEMA_BYTES} bytes")
    for path, key, value in _keywords(schema, "#"):
        where = f"{path}/{key}"
        if key not in ENFORCED and key not in ANNOTATIONS:
            raise UnsupportedSchema(f"schema keyword {key!r} at {path} is not enforced by sinkd")
        if key == "$ref" and not (isinstance(value, str) and value.startswith("#/")):
            raise UnsupportedSchema(f"{where}: only references inside the schema (#/...)")
        if key == "format" and value not in FORMATS:
            raise UnsupportedSchema(f"{where}: format {value!r} is not enforced by sinkd")
        if key in (*BOUNDS, "multipleOf") and (
            not isinstance(value, int | float) or isinstance(value, bool)
        ):
            raise InvalidInput(f"{where}: {key} must be a number")
        if key == "multipleOf" and value <= 0:
            raise InvalidInput(f"{where}: multipleOf must be above 0")
        if key == "type":
            kinds = value if isinstance(value, list) else [value]
            if not kinds or any(k not in TYPES for k in kinds):
                raise UnsupportedSchema(f"{where}: type {value!r} is not a JSON schema type")
    converter = Converter(  # type: ignore[no-untyped-call]
        prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False
    )
    try:
        resolved = converter.resolve_refs(json.loads(json.dumps(schema)), "input")
        converter.visit(resolved, "")
        text = str(converter.format_grammar())  # type: ignore[no-untyped-call]
    except UnsupportedSchema:
        raise
    except (AssertionError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise InvalidInput(f"the schema cannot be made a grammar: {e}") from None
    return "\n".join(
        JSON_CHAR if line.startswith("char ::= ") else line for line in text.splitlines()
    )


def excluded_strings(node: Any) -> tuple[list[str], tuple[str, ...]] | None:
    """What a `not` excludes, where sinkd can say it exactly: strings (`enum`) and beginnings
    (`pattern` "^(?:a|b)", each literal as `re.escape` writes it), or an `anyOf` of those; None
    for any other `not`."""
    if not isinstance(node, dict):
        return None
    if set(node) == {"anyOf"} and isinstance(node["anyOf"], list):
        subs = node["anyOf"]
        if not subs or any(not isinstance(x, dict) or "anyOf" in x for x in subs):
            return None  # one level: strings and beginnings
        parts = [excluded_strings(x) for x in subs]
        if any(p is None for p in parts):
            return None
        return (
            [s for p in parts if p for s in p[0]],
            tuple(b for p in parts if p for b in p[1]),
        )
    if set(node) == {"enum"} and isinstance(node["enum"], list):
        return (node["enum"], ()) if all(isinstance(v, str) for v in node["enum"]) else None
    if set(node) == {"pattern"} and isinstance(node["pattern"], str):
        text = node["pattern"]
        if not (text.startswith("^(?:") and text.endswith(")")):
            return None
        literals = tuple(re.sub(r"\\(.)", r"\1", a) for a in re.split(r"(?<!\\)\|", text[4:-1]))
        if "^(?:" + "|".join(map(re.escape, literals)) + ")" != text or "" in literals:
            return None
        return [], literals
    return None


class Converter(llama_grammar.SchemaConverter):
    """llama-cpp-python's converter, with the rules its port lacks and llama.cpp's C++ converter
    (or OpenAI) has: integer ranges, number bounds, OpenAI's string formats."""

    def visit(self, schema: Any, name: str) -> str:
        kind = schema.get("type") if isinstance(schema, dict) else None
        if isinstance(schema, dict) and "not" in schema:
            return self._string_except(schema, name)
        own = isinstance(schema, dict) and not any(
            k in schema for k in ("$ref", "anyOf", "oneOf", "allOf", "const", "enum")
        )
        if own and kind in ("integer", "number") and "multipleOf" in schema:
            bounds = schema_rules.number_bounds(schema)
            values = schema_rules.multiples(bounds, schema["multipleOf"])
            if values is not None:  # a few values: each one a literal, exact
                if not values:
                    raise InvalidInput(f"the schema at {name or '#'}: no multiple in its bounds")
                return self._own(name, "(" + " | ".join(f'"{v}"' for v in values) + ") space")
        if own and kind == "integer" and any(k in schema for k in BOUNDS):
            lo, hi = schema_rules.integer_bounds(schema)
            try:
                rule = schema_rules.integer_range(lo, hi)
            except ValueError as e:
                raise InvalidInput(f"the schema at {name or '#'}: {e}") from None
            return self._own(name, f"({rule}) space")
        if own and kind == "number" and any(k in schema for k in BOUNDS):
            bounds = schema_rules.number_bounds(schema)
            if bounds.empty():
                raise InvalidInput(f"the schema at {name or '#'}: no number within its bounds")
            return self._own(name, f"({schema_rules.number_range(bounds)}) space")
        if own and kind in (None, "string") and "format" in schema and "pattern" not in schema:
            bounded = schema_rules.format_rule(schema["format"], schema.get("maxLength"))
            rule = f'"\\"" ({bounded}) "\\"" space'
            return self._own(name, rule)
        return str(super().visit(schema, name))  # type: ignore[no-untyped-call]

    def _string_except(self, schema: dict[str, Any], name: str) -> str:
        """A string that is none of `not`'s strings and begins with none of its beginnings: the
        one kind of `not` sinkd enforces (`excluded_strings`)."""
        where = name or "#"
        found = excluded_strings(schema["not"])
        if (
            found is None
            or schema.get("type") != "string"
            or any(k not in ANNOTATIONS | {"type", "minLength", "maxLength", "not"} for k in schema)
        ):
            raise UnsupportedSchema(
                f"schema keyword 'not' at {where}: sinkd enforces only a string's"
                ' "not": {"enum": [strings]}, {"pattern": "^(?:literal|...)"} or an anyOf of'
                " the two (with minLength, maxLength)"
            )
        excluded, beginnings = found
        every = [*excluded, *beginnings]
        if len(every) > schema_rules.MAX_EXCLUDED or (
            sum(map(len, every)) > schema_rules.MAX_EXCLUDED_CHARS
        ):
            raise InvalidInput(
                f"{where}/not: at most {schema_rules.MAX_EXCLUDED} strings of"
                f" {schema_rules.MAX_EXCLUDED_CHARS} characters together"
            )
        self._add_rule("char", JSON_CHAR.split(" ::= ", 1)[1])  # type: ignore[no-untyped-call]
        rule_name = name + "-" if name in llama_grammar.RESERVED_NAMES else name or "root"
        base = llama_grammar.INVALID_RULE_CHARS_RE.sub("-", rule_name)  # as `_add_rule` names
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        states = schema_rules.string_except(f"{base}-s", excluded, low, high, beginnings)
        for state, body in states.items():
            self._add_rule(state, body)  # type: ignore[no-untyped-call]
        return self._own(name, f'"\\"" {base}-s-x0 space')

    def _own(self, name: str, rule: str) -> str:
        rule_name = name + "-" if name in llama_grammar.RESERVED_NAMES else name or "root"
        return str(self._add_rule(rule_name, rule))  # type: ignore[no-untyped-call]


def json_object_grammar() -> str:
    """Any JSON object (`response_format: json_object`)."""
    return schema_grammar({"type": "object"})


def _keywords(node: Any, path: str) -> Iterator[tuple[str, str, Any]]:
    """(path, keyword, value) of every keyword in the schema and its sub-schemas."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            yield from _keywords(item, f"{path}/{i}")
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        yield path, key, value
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            for name, sub in value.items():
                yield from _keywords(sub, f"{path}/{key}/{name}")
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            yield from _keywords(value, f"{path}/{key}")
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems") and isinstance(value, list):
            for i, sub in enumerate(value):
                yield from _keywords(sub, f"{path}/{key}/{i}")


TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def candidates(data: Any, n: int) -> Any:
    """llama.cpp's view (`llama_token_data_array`) of the first `n` rows of a TOKEN_DATA array."""
    return llama.llama_token_data_array(
        data=data.ctypes.data_as(ctypes.POINTER(llama.llama_token_data)),
        size=n,
        selected=-1,
        sorted=False,
    )


class GrammarMask:
    """One reply's grammar state: masks the tokens it forbids, follows the tokens taken. Engine
    thread; freed with the job (`close`)."""

    def __init__(self, vocab: Any, grammar: str) -> None:
        self._sampler = llama.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        if not self._sampler:
            raise InvalidInput("llama.cpp refused the grammar")
        self._one = np.zeros(1, dtype=TOKEN_DATA)  # `allows`' candidate, every token

    def mask(self, data: Any, n: int) -> None:
        """Apply the grammar to a filled `llama_token_data` array of `n` candidates: the logits
        of forbidden tokens become -inf."""
        arr = candidates(data, n)
        llama.llama_sampler_apply(self._sampler, ctypes.byref(arr))

    def allows(self, token: int) -> bool:
        """Whether the grammar allows `token` next."""
        one = self._one
        one["id"], one["logit"] = token, 0.0
        self.mask(one, 1)
        return bool(np.isfinite(one["logit"][0]))

    def accept(self, token: int) -> None:
        llama.llama_sampler_accept(self._sampler, token)

    def close(self) -> None:
        if self._sampler:
            llama.llama_sampler_free(self._sampler)
            self._sampler = None

    def __del__(self) -> None:  # a job failed or dropped anywhere frees its grammar too
        self.close()
