"""Structured output's schema gate, without a model: what the grammar enforces is compiled by
llama-cpp-python's converter; what it cannot enforce is refused by name and path."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, Field

from sinkd.daemon.engine.grammar import (
    JSON_CHAR,
    UnsupportedSchema,
    json_object_grammar,
    schema_grammar,
)
from sinkd.errors import InvalidInput

pytestmark = pytest.mark.unit


class Item(BaseModel):
    name: str = Field(max_length=20, description="what it is called")
    tags: list[str] = Field(max_length=3)
    kind: str = Field(pattern="^[a-z]+$")


class Order(BaseModel):
    items: list[Item]
    rush: bool | None = None


def test_a_pydantic_schema_with_definitions_compiles() -> None:
    grammar = schema_grammar(Order.model_json_schema())
    assert "root ::=" in grammar
    assert "items" in grammar


def test_strings_never_take_raw_control_characters() -> None:
    """llama-cpp-python's port lets a raw newline into a string; the grammar is llama.cpp's."""
    for grammar in (schema_grammar(Order.model_json_schema()), json_object_grammar()):
        chars = [line for line in grammar.splitlines() if line.startswith("char ::= ")]
        assert chars == [JSON_CHAR]
        assert "\\x00-\\x1F" in JSON_CHAR


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "'uniqueItems' at #"),
        ({"not": {"type": "string"}}, "'not' at #"),
        ({"type": "object", "patternProperties": {"^x": {}}}, "'patternProperties' at #"),
        ({"$defs": {"a": {"type": "string", "if": {}}}}, "'if' at #/$defs/a"),
        ({"type": "string", "format": "uri"}, "format 'uri'"),
        ({"type": "object", "minProperties": 1}, "'minProperties' at #"),
        ({"$ref": "https://example.com/schema.json"}, "only references inside the schema"),
        ({"type": "text"}, "not a JSON schema type"),
    ],
)
def test_what_the_grammar_cannot_enforce_is_refused_by_name(schema: Any, named: str) -> None:
    with pytest.raises(UnsupportedSchema, match=named.replace("$", "\\$")):
        schema_grammar(schema)


def test_not_a_schema_is_refused() -> None:
    with pytest.raises(InvalidInput):
        schema_grammar(["not", "an", "object"])
    with pytest.raises(InvalidInput, match="larger than"):
        schema_grammar({"type": "object", "description": "x" * 70_000})
