"""Served: an answer as every service hands it to its transport, and the names that travel
with one (headers, the SSE error event). A module of its own so that serving here and
forwarding to a member share it without importing each other."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson

from ..errors import ModelBossError
from .redact import redacted

MODEL_HEADER = "x-model-boss-model"
WAIT_HEADER = "x-model-boss-queue-wait-s"

@dataclass(slots=True)
class Served:
    """An answer: ``body`` whole, or ``chunks`` to pass on as they come."""

    status: int
    headers: dict[str, str]
    media_type: str
    body: bytes = b""
    chunks: AsyncIterator[bytes] | None = None


def sse_error(exc: Exception) -> bytes:
    """The SSE event that carries a failure once a stream has started (same envelope)."""
    if not isinstance(exc, ModelBossError):
        exc = ModelBossError(f"stream failed: {exc}", code="stream_failed")
    return b"data: " + orjson.dumps(redacted(exc).envelope()) + b"\n\n"
