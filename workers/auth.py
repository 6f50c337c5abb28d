"""The private worker key: with one, every route answers ``refusal()`` (a 401) unless the
request carries ``Authorization: Bearer <key>`` (the coordinator's per-worker secret)."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import Response


def require_key(app: FastAPI, api_key: str | None, refusal: Callable[[], Response]) -> None:
    if not api_key:
        return
    expected = f"Bearer {api_key}".encode()

    @app.middleware("http")
    async def _authorize(request: Request,
                         call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        given = request.headers.get("authorization", "").encode()
        if not secrets.compare_digest(given, expected):
            return refusal()
        return await call_next(request)
