"""CORS: which browser pages may call the API. ``cors_origins`` lists them as
``scheme://host`` (that origin), ``scheme://host:*`` (any port, or none) or ``*`` (any page);
the default is the loopback origins, as Ollama allows. A preflight needs no key; every answer
to an allowed origin, errors included, carries the headers a page needs to read it."""

from __future__ import annotations

import re
from collections.abc import Sequence

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from ...services import CACHED_PREFIX_HEADER, MODEL_HEADER, REPLICA_HEADER, WAIT_HEADER
from .direct_routes import header

EXPOSED = [MODEL_HEADER, WAIT_HEADER, REPLICA_HEADER, CACHED_PREFIX_HEADER,
           "x-model-boss-member", "retry-after"]


def origin_pattern(origins: Sequence[str]) -> str | None:
    """One regular expression for every listed origin; None when the list is empty."""
    parts = []
    for origin in origins:
        if origin.endswith(":*"):
            parts.append(re.escape(origin[:-2]) + r"(:\d{1,5})?")
        else:
            parts.append(re.escape(origin))
    return "|".join(parts) if parts else None


def with_cors(app: ASGIApp, origins: Sequence[str]) -> ASGIApp:
    """``app`` behind Starlette's CORS middleware for ``origins``."""
    any_origin = "*" in origins
    return PagesOnly(app, CORSMiddleware(
        app, allow_origins=["*"] if any_origin else [],
        allow_origin_regex=None if any_origin else origin_pattern(origins),
        allow_methods=["*"], allow_headers=["*"], expose_headers=EXPOSED, max_age=600))


class PagesOnly:
    """A request without an ``Origin`` header (no page sent it) goes straight to ``app``, as
    the CORS middleware would pass it on, without building its headers first."""

    def __init__(self, app: ASGIApp, cors: CORSMiddleware) -> None:
        self.app, self.cors = app, cors

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and header(scope, b"origin") is None:
            await self.app(scope, receive, send)
        else:
            await self.cors(scope, receive, send)
