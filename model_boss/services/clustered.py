"""Serving in a cluster: here, or forwarded to the member the cluster names.

A request that arrived as a forward is always served here (one hop at most). A forward
carries the request's priority, client id, keep-alive, budget left and other ``x_*`` fields
in its body; its answer passes through untouched, a stream chunk by chunk. A member that
cannot be reached is forgotten until its next heartbeat and the request is served here.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..cluster import MEMBER_HEADER, MemberUnreachable
from ..inference import QueuedRequest
from .extensions import Extensions
from .native import NATIVE_BODIES

if TYPE_CHECKING:
    from ..coordinator import Coordinator
    from .serving import Served

log = logging.getLogger(__name__)

# the endpoints a member answers on the same path as the worker's (images are kept where
# they arrive: their files are served by the member that wrote them)
FORWARDABLE = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                         "/v1/responses", "/v1/audio/speech", *NATIVE_BODIES})


def forward_body(body: dict[str, Any], queued: QueuedRequest,
                 ext: Extensions) -> dict[str, Any]:
    """The body a member sends on: the request's own fields plus its extensions, resolved."""
    carried = {"x_client_id": queued.client_id, "x_priority": queued.priority,
               "x_keep_alive_s": ext.keep_alive_s, "x_thinking": ext.thinking,
               "x_budget_s": queued.budget_s}
    return {**body, **ext.extra, **{k: v for k, v in carried.items() if v is not None}}


async def serve_clustered(coord: Coordinator, queued: QueuedRequest, body: dict[str, Any],
                          ext: Extensions, here: Callable[[], Awaitable[Served]]) -> Served:
    """Serve ``queued`` where the cluster says; ``here`` serves it on this member."""
    cluster = coord.cluster
    if cluster is None or ext.forwarded or queued.endpoint not in FORWARDABLE:
        return await here()
    route = await cluster.route(queued.model_id, queued.priority)
    async with cluster.holding(route):
        if route.member is None:
            served = await here()
            served.headers[MEMBER_HEADER] = cluster.host_id
            return served
        stream = bool(body.get("stream"))
        try:
            reply = await cluster.forwarder.forward(route.member, queued.endpoint,
                                                    forward_body(body, queued, ext), stream)
        except MemberUnreachable as exc:
            log.warning("%s", exc)
            cluster.unreachable(route.member)
            served = await here()
            served.headers[MEMBER_HEADER] = cluster.host_id
            return served
    from .serving import MODEL_HEADER, Served, sse_error

    headers = {MODEL_HEADER: queued.model_id, MEMBER_HEADER: route.member.host_id}
    if reply.chunks is None:
        return Served(reply.status, headers, reply.content_type, body=reply.body or b"")
    return Served(reply.status, headers, reply.content_type,
                  chunks=_relay(reply.chunks, sse_error))


async def _relay(chunks: AsyncIterator[bytes],
                 sse_error: Callable[[Exception], bytes]) -> AsyncIterator[bytes]:
    """Chunks as the member sent them; a member lost mid-stream ends it with an SSE error."""
    try:
        async for chunk in chunks:
            yield chunk
    except Exception as exc:  # the member went away mid-stream
        log.warning("forwarded stream failed: %s", exc)
        yield sse_error(exc)
        yield b"data: [DONE]\n\n"
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
