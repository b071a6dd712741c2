"""Client values into pydantic models: a violated bound is `InvalidInput` naming the field."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from sinkd.errors import InvalidInput, echo

M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], **fields: Any) -> M:
    """Build a pydantic model from a client's values; a violated bound is InvalidInput naming the
    field (the edges report it as INVALID_ARGUMENT or exit code 2)."""
    try:
        return model(**fields)
    except ValidationError as e:
        raise InvalidInput(first_problem(e, model.__name__)) from None


def first_problem(error: ValidationError, where: str = "") -> str:
    """The first field a pydantic validation refused, as `field: why, got value`."""
    first = error.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or where
    return f"{field}: {first['msg']}, got {echo(first.get('input'))}"
