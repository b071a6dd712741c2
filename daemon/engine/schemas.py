"""A reply checked against its JSON schema after generation: what the grammar cannot say exactly (a
float's bounds, `multipleOf`, a hostname's length) is checked here, so a reply that breaks its
schema is never returned as valid. It reads only the keywords sinkd accepts (`grammar.ENFORCED`);
a schema with any other was refused before generation.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from sinkd.errors import SchemaUnmet

_DURATION = re.compile(
    r"P(?:(?:\d+D|\d+M(?:\d+D)?|\d+Y(?:\d+M(?:\d+D)?)?)(?:T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S))?"
    r"|T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S)|\d+W)"
)
_TIME = re.compile(r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_LABEL = re.compile(r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?")
_ATOM = re.compile(r"[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+")
_UUID = re.compile(r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")


def violation(schema: dict[str, Any], text: str) -> str | None:
    """What in `text` breaks `schema` (the value's path and the keyword), or None."""
    try:
        value = json.loads(text, parse_float=Decimal)
    except ValueError:
        return "$: not one JSON value"
    return _check(schema, value, "$", schema)


def check_reply(schema: dict[str, Any], text: str) -> None:
    """SchemaUnmet naming where and which keyword, or nothing."""
    if (found := violation(schema, text)) is not None:
        raise SchemaUnmet(
            f"the reply breaks its schema: {found} (checked after generation: the grammar keeps"
            " the value's form, not every bound)"
        )


def _check(schema: Any, value: Any, path: str, root: dict[str, Any]) -> str | None:
    if not isinstance(schema, dict):
        return None if schema is not False else f"{path}: the schema allows nothing here"
    if (ref := schema.get("$ref")) is not None:
        return _check(_resolve(root, ref), value, path, root)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            fits = [_check(sub, value, path, root) is None for sub in schema[key]]
            if not any(fits):
                return f"{path}: matches none of {key}"
            if key == "oneOf" and sum(fits) > 1:
                return f"{path}: matches more than one of oneOf"
    for sub in schema.get("allOf", ()):
        if (found := _check(sub, value, path, root)) is not None:
            return found
    if "const" in schema and not _same(value, schema["const"]):
        return f"{path}: not the schema's const"
    if "enum" in schema and not any(_same(value, v) for v in schema["enum"]):
        return f"{path}: not one of the schema's enum"
    if isinstance(schema.get("not"), dict) and _check(schema["not"], value, path, root) is None:
        return f"{path}: matches what its not excludes"
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is(value, k) for k in kinds):
            return f"{path}: not of type {schema['type']}"
    if isinstance(value, int | Decimal) and not isinstance(value, bool):
        return _number(schema, Decimal(value), path)
    if isinstance(value, str):
        return _string(schema, value, path)
    if isinstance(value, list):
        return _array(schema, value, path, root)
    if isinstance(value, dict):
        return _object(schema, value, path, root)
    return None


def _number(schema: dict[str, Any], value: Decimal, path: str) -> str | None:
    tests: dict[str, Callable[[Decimal], bool]] = {
        "minimum": lambda b: value >= b,
        "maximum": lambda b: value <= b,
        "exclusiveMinimum": lambda b: value > b,
        "exclusiveMaximum": lambda b: value < b,
        "multipleOf": lambda m: m > 0 and (value / m) % 1 == 0,
    }
    for key, holds in tests.items():
        bound = schema.get(key)
        if isinstance(bound, int | float) and not isinstance(bound, bool):
            try:
                if not holds(Decimal(str(bound))):
                    return f"{path}: {value} breaks {key} {bound}"
            except InvalidOperation:
                return f"{path}: {value} breaks {key} {bound}"
    return None


def _string(schema: dict[str, Any], value: str, path: str) -> str | None:
    if len(value) < schema.get("minLength", 0):
        return f"{path}: shorter than minLength {schema['minLength']}"
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        return f"{path}: longer than maxLength {schema['maxLength']}"
    if "pattern" in schema and re.search(schema["pattern"], value) is None:
        return f"{path}: does not match its pattern"
    if "format" in schema and not _formatted(schema["format"], value):
        return f"{path}: not a valid {schema['format']}"
    return None


def _formatted(form: str, value: str) -> bool:
    try:
        if form == "date":
            return bool(_DATE.fullmatch(value)) and bool(datetime.date.fromisoformat(value))
        if form == "time":
            return bool(_TIME.fullmatch(value))
        if form == "date-time":
            day, sep, clock = value.partition("T")
            return bool(sep) and _formatted("date", day) and _formatted("time", clock)
        if form == "duration":
            return bool(_DURATION.fullmatch(value))
        if form == "uuid":
            return bool(_UUID.fullmatch(value))
        if form == "hostname":
            return _hostname(value)
        if form == "email":
            local, at, domain = value.rpartition("@")
            atoms = local.split(".")
            return (bool(at) and all(_ATOM.fullmatch(a) for a in atoms) and len(local) <= 64) and (
                "." in domain and _hostname(domain)
            )
        if form == "ipv4":
            return isinstance(ipaddress.ip_address(value), ipaddress.IPv4Address)
        if form == "ipv6":
            return isinstance(ipaddress.ip_address(value), ipaddress.IPv6Address)
    except ValueError:
        return False
    return False


def _hostname(value: str) -> bool:
    return len(value) <= 253 and all(_LABEL.fullmatch(label) for label in value.split("."))


def _array(schema: dict[str, Any], value: list[Any], path: str, root: dict[str, Any]) -> str | None:
    if len(value) < schema.get("minItems", 0):
        return f"{path}: fewer items than minItems {schema['minItems']}"
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        return f"{path}: more items than maxItems {schema['maxItems']}"
    prefix = schema.get("prefixItems", [])
    items = schema.get("items")
    if isinstance(items, list):  # draft 4-2019's tuple form
        prefix, items = items, None
    for i, item in enumerate(value):
        sub = prefix[i] if i < len(prefix) else items
        if sub is not None and (found := _check(sub, item, f"{path}[{i}]", root)) is not None:
            return found
    return None


def _object(
    schema: dict[str, Any], value: dict[str, Any], path: str, root: dict[str, Any]
) -> str | None:
    properties = schema.get("properties", {})
    for name in schema.get("required", ()):
        if name not in value:
            return f"{path}: lacks required {name!r}"
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        where = f"{path}.{name}"
        if name in properties:
            found = _check(properties[name], item, where, root)
        elif extra is False:
            found = f"{path}: {name!r} is not among its properties"
        else:
            found = _check(extra, item, where, root) if isinstance(extra, dict) else None
        if found is not None:
            return found
    return None


def _resolve(root: dict[str, Any], ref: str) -> Any:
    node: Any = root
    for part in ref.removeprefix("#/").split("/"):
        if part:
            node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, Decimal) and value == value.to_integral_value()
        )
    return {
        "null": value is None,
        "boolean": isinstance(value, bool),
        "number": isinstance(value, int | Decimal) and not isinstance(value, bool),
        "string": isinstance(value, str),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }.get(kind, False)


def _same(value: Any, expected: Any) -> bool:
    if isinstance(expected, float):
        expected = Decimal(str(expected))
    return bool(type(value) is type(expected) and value == expected) or (
        isinstance(value, int | Decimal)
        and isinstance(expected, int | Decimal)
        and not isinstance(value, bool)
        and not isinstance(expected, bool)
        and value == expected
    )
