"""The OpenAPI document as clients read it: numeric bounds under JSON Schema's own keywords.

pydantic writes a bound set on a field whose type has a validator of its own (the request
numbers that refuse strings and booleans: ``Int`` and ``Number`` in
services/extensions.py) under the bound's Python name (``ge``, ``le``, ``gt``, ``lt``), which
no client, code generator or fuzzer reads as a bound. They are renamed here; where a schema
has the keyword already, the tighter of the two stays."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html
from fastapi.responses import HTMLResponse

# where /docs and /redoc load Swagger UI's and ReDoc's files from (the fastapi-offline
# package's copies), on this server
DOCS_ASSETS = "/docs-assets"
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


def offline_redoc(app: FastAPI, path: str = "/redoc") -> None:
    """ReDoc at ``path`` from the package's copy (fastapi-offline's). ReDoc shows its maker's
    logo from their CDN whatever it is told: the page's Content-Security-Policy keeps images,
    fonts and fetches on this server, so the browser never asks (the link stays, as text)."""

    @app.get(path, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_redoc_html(openapi_url=f"{root}{app.openapi_url}",
                              title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{root}{DOCS_ASSETS}/redoc.standalone.js",
                              redoc_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
                              with_google_fonts=False)
        page.headers["Content-Security-Policy"] = ("img-src 'self' data:; font-src 'self' "
                                                   "data:; connect-src 'self'")
        return page
