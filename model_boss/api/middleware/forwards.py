"""ForwardTrust: a request that says it was forwarded by a cluster member is taken only when
its secret is the cluster's, and only on the inference routes members forward; anything else
carrying the header (a forgery, a box outside the cluster) is a 403 before any work."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from ...cluster import FORWARDED_HEADER, forward_refusal
from ...coordinator import Coordinator
from ...services.clustered import FORWARDABLE
from ..errors import envelope

_FORWARDED = FORWARDED_HEADER.encode()


class ForwardTrust:
    def __init__(self, app: ASGIApp, coordinator: Coordinator) -> None:
        self.app = app
        self.coord = coordinator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # a forward from a cluster member, or a forgery
        if scope["type"] == "http" and any(name.lower() == _FORWARDED
                                           for name, _ in scope["headers"]):
            cluster = self.coord.cluster
            refusal = forward_refusal(Headers(scope=scope), cluster.secret if cluster else None)
            if refusal is None and scope["path"] not in FORWARDABLE:
                refusal = "forwards are taken on inference routes only"  # members send no other
            if refusal is not None:
                await envelope(refusal, 403, code="forward_refused")(scope, receive, send)
                return
        await self.app(scope, receive, send)
