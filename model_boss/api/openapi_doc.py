"""The OpenAPI document as clients read it: numeric bounds under JSON Schema's own keywords.

pydantic writes a bound set on a field whose type has a validator of its own (the request
numbers that refuse strings and booleans: ``Int`` and ``Number`` in
services/extensions.py) under the bound's Python name (``ge``, ``le``, ``gt``, ``lt``), which
no client, code generator or fuzzer reads as a bound. They are renamed here; where a schema
has the keyword already, the tighter of the two stays."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

BOUNDS = {"ge": ("minimum", max), "gt": ("exclusiveMinimum", max),
          "le": ("maximum", min), "lt": ("exclusiveMaximum", min)}
NUMERIC = ("integer", "number")


def standard_bounds(node: Any) -> Any:
    """``node`` (a JSON schema, or a document holding them) with every numeric schema's
    Python-named bounds renamed; changed in place and returned."""
    if isinstance(node, dict):
        if isinstance(node.get("type"), str) and node["type"] in NUMERIC:
            for raw, (keyword, tighter) in BOUNDS.items():
                value = node.get(raw)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    del node[raw]
                    node[keyword] = tighter(node[keyword], value) if keyword in node else value
        for child in node.values():
            standard_bounds(child)
    elif isinstance(node, list):
        for child in node:
            standard_bounds(child)
    return node


def document_bounds(app: FastAPI) -> None:
    """``app.openapi()`` (and so ``/openapi.json``) with the bounds renamed, built once."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = standard_bounds(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
