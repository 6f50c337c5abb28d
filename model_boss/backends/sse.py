"""Server-sent events as whole events, however the bytes of a stream were cut."""

from __future__ import annotations

from collections.abc import AsyncIterator


async def sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Whole SSE events, each ending in a blank line (``\\r\\n`` read as ``\\n``)."""
    buffer = b""
    async for chunk in chunks:
        buffer += chunk.replace(b"\r\n", b"\n")
        while b"\n\n" in buffer:
            whole, buffer = buffer.split(b"\n\n", 1)
            yield whole + b"\n\n"
    if buffer.strip():
        yield buffer + b"\n\n"


def sse_data(whole: bytes) -> bytes | None:
    """An event's data (its ``data:`` lines joined); None for a comment or a bare event."""
    lines = [line[5:].lstrip() for line in whole.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None
