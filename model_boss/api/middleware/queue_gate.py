"""QueueGate: a request that the queue would refuse whatever its body says is refused before
its body is read or parsed, so a burst far over the limits costs little per request."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from ...coordinator import Coordinator
from ...scheduling.request import ARRIVING
from ...tenancy.keys import identity_of
from ..errors import error_response


class QueueGate:
    """429 with ``Retry-After`` for a POST to one of ``paths`` (the routes whose requests
    wait in the queue) while the queue is full, or while the client its ``x-client-id``
    header names holds its whole share, counting the requests let through that have not
    reached the queue yet (a burst is refused here once it fills the limits, not after each
    request's parse). Everything else goes on; the queue checks every limit again when the
    request is queued. Off on a cluster member, which may forward the request to a member
    with room."""

    def __init__(self, app: ASGIApp, coordinator: Coordinator, paths: frozenset[str]) -> None:
        self.app = app
        self.coord = coordinator
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["method"] == "POST"
                and scope["path"] in self.paths and self.coord.cluster is None):
            queue = self.coord.queue
            who = identity_of(scope)
            client_id = who.client if who is not None else None
            refusal = queue.refusal(client_id)
            if refusal is not None:
                await error_response(refusal)(scope, receive, send)
                return
            arrived = queue.arrivals.enter(client_id)
            token = ARRIVING.set(arrived)
            try:
                await self.app(scope, receive, send)
            finally:
                arrived()  # refused, failed or answered without queueing: no longer arriving
                ARRIVING.reset(token)
            return
        await self.app(scope, receive, send)
