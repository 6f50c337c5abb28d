"""EarlyForwarding: on a cluster member, a request for a model warm on another member is
sent there from here, ahead of FastAPI's routing, validation and dependency handling.

It sits inside the other middleware (keys, forward checks, metrics and body limits have run
and still see the answer) and answers only what
:func:`~model_boss.services.early_forward.early_forward` says to forward; everything else,
and a request whose member turns out unreachable, goes on to the routes with its body
replayed. While the member works the client is watched: one that goes away cancels the
forward (the member sees its connection close), as on the full path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from ...cluster import MemberUnreachable
from ...coordinator import Coordinator
from ...errors import ModelBossError
from ...services import ClientDisconnected, Served
from ...services.early_forward import EARLY_PATHS, early_forward, send_early
from ...services.redact import redacted
from ...tenancy.keys import identity_of
from ..context import to_response
from ..errors import error_response
from .limits import replaying


class EarlyForwarding:
    """Forward at once what needs no decision beyond "warm on that member"."""

    def __init__(self, app: ASGIApp, coordinator: Coordinator) -> None:
        self.app = app
        self.coord = coordinator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (self.coord.cluster is None or scope["type"] != "http"
                or scope["method"] != "POST" or scope["path"] not in EARLY_PATHS):
            await self.app(scope, receive, send)
            return
        raw = await _body(receive)
        if raw is None:
            return  # the client went away while sending it
        early = early_forward(self.coord, scope["path"], raw, Headers(scope=scope),
                              identity_of(scope))
        if early is not None:
            try:
                served = await _unless_gone(receive, send_early(self.coord, early))
            except MemberUnreachable:
                pass  # forgotten until its next heartbeat; the full path serves it here
            except ClientDisconnected:
                return
            except ModelBossError as exc:
                await error_response(redacted(exc))(scope, receive, send)
                return
            else:
                await to_response(served)(scope, receive, send)
                return
        await self.app(scope, replaying(raw, receive), send)


async def _body(receive: Receive) -> bytes | None:
    """The whole body (:class:`~.limits.BodyLimit` hands it over in one message); None
    when the client disconnected."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _unless_gone(receive: Receive, work: Awaitable[Served]) -> Served:
    """Await ``work``, racing the client's disconnect; a client gone first cancels the work
    and raises :class:`~model_boss.services.ClientDisconnected`."""
    job = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((job, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()  # it holds nothing: not waited for
        if not job.done():  # the forward closes its connection: the member sees it go
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await job
    if job.cancelled():
        raise ClientDisconnected("client disconnected")
    return job.result()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
