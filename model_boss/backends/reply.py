"""What a server we pass a request on to answered, whichever client carried it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass


class UpstreamTransportError(Exception):
    """The remote could not be reached, or broke the connection."""


@dataclass(slots=True)
class UpstreamReply:
    status: int
    content_type: str
    body: bytes | None
    chunks: AsyncIterator[bytes] | None
    retry_after: str | None = None  # the remote's Retry-After, on an error answer
