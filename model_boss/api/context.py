"""What a route needs from its connection: the coordinator, a disconnect signal, and the
conversion of a service's answer into a response."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from ..coordinator import Coordinator
from ..services import Departure, Served


def coordinator_of(request: Request) -> Coordinator:
    return request.app.state.coordinator


@contextlib.asynccontextmanager
async def disconnect_watch(request: Request) -> AsyncIterator[Departure]:
    """A :class:`Departure` set when the client goes away, cancelling the service's guarded
    work. One listener per request, stopped before the response is sent (a streaming
    response listens for itself)."""
    gone = Departure()

    async def listen() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone.set()

    listener = asyncio.create_task(listen())
    try:
        yield gone
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await listener


def to_response(served: Served) -> Response:
    if served.chunks is None:
        return Response(served.body, status_code=served.status, headers=served.headers,
                        media_type=served.media_type)
    return StreamingResponse(served.chunks, status_code=served.status, headers=served.headers,
                             media_type=served.media_type)
