"""The private worker key: with one, every route answers ``refusal()`` (a 401) unless the
request carries ``Authorization: Bearer <key>`` (the coordinator's per-worker secret)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response


def require_key(app: FastAPI, api_key: str | None, refusal: Callable[[], Response]) -> None:
    if not api_key:
        return
    expected = f"Bearer {api_key}".encode()

    class _Authorize:
        # plain ASGI: FastAPI's ``@app.middleware("http")`` wraps every request and answer in
        # task groups and memory streams, about half the event loop's CPU for a one-sentence
        # embedding request (benchmarks/embeddings_batching.py)
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
                if not secrets.compare_digest(given, expected):
                    await refusal()(scope, receive, send)
                    return
            await self.inner(scope, receive, send)

    app.add_middleware(_Authorize)
