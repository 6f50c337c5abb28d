"""Validation failures as model-boss errors: the first problem, its field as ``param``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ..errors import BadRequest

M = TypeVar("M", bound=BaseModel)
_LOCATIONS = {"body", "query", "path", "header", "cookie"}
_NOT_AN_OBJECT = {"model_attributes_type", "model_type", "dict_type"}


def parse(model: type[M], data: Any) -> M:
    """Validate ``data`` as ``model``; a failure is a :class:`BadRequest` naming the field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise bad_request(exc.errors()) from exc


def bad_request(errors: Sequence[Any]) -> BadRequest:
    """pydantic's (or FastAPI's) error list → one BadRequest about the first problem."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    loc = [str(part) for part in first.get("loc", ())]
    if loc and loc[0] in _LOCATIONS:
        loc = loc[1:]
    message = str(first.get("msg", "invalid request"))
    if first.get("type") == "json_invalid":
        loc = []  # the position of a JSON syntax error is not a field
        message = f"request body is not valid JSON: {(first.get('ctx') or {}).get('error')}"
    param = ".".join(loc) or None
    if param is None and first.get("type") == "missing":
        message = "request body is empty; expected a JSON object"
    elif param is None and first.get("type") in _NOT_AN_OBJECT:
        message = "request body must be a JSON object"
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    code = "missing_field" if first.get("type") == "missing" else "invalid_request"
    return BadRequest(f"{param}: {message}" if param else message, param=param, code=code)
