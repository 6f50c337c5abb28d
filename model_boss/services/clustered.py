"""Serving in a cluster: here, or forwarded to the member the cluster names.

A request that arrived as a forward is always served here (one hop at most). A forward
carries the request's priority, client id, keep-alive, budget left and other ``x_*`` fields
in its body; its answer passes through untouched, a stream chunk by chunk. A member that
cannot be reached is forgotten until its next heartbeat and the request is served here.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson

from ..cluster import MEMBER_HEADER, MemberRecord, MemberUnreachable
from ..errors import CapacityExceeded, LoadFailed, ModelBossError, ModelUnavailable, WorkerCrashed
from ..scheduling.queue import QueuedRequest
from .extensions import Extensions
from .native import NATIVE_BODIES
from .served import MODEL_HEADER, Served, StreamEnd, openai_stream_end

if TYPE_CHECKING:
    from ..coordinator import Coordinator

log = logging.getLogger(__name__)

# the endpoints a member answers on the same path as the worker's (images are kept where
# they arrive: their files are served by the member that wrote them)
FORWARDABLE = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                         "/v1/rerank",
                         "/v1/responses", "/v1/audio/speech", "/v1/messages",
                         "/v1/messages/count_tokens", *NATIVE_BODIES})


def forward_body(body: dict[str, Any], ext: Extensions, *, client_id: str, priority: int,
                 budget_s: float | None) -> dict[str, Any]:
    """The body a member sends on: the request's own fields plus its extensions, resolved."""
    identity = ext.identity
    carried = {"x_client_id": client_id, "x_priority": priority,
               "x_keep_alive_s": ext.keep_alive_s, "x_thinking": ext.thinking,
               "x_budget_s": budget_s, "x_key": identity and identity.key,
               "x_end_user": identity and identity.end_user}
    return {**body, **ext.extra, **{k: v for k, v in carried.items() if v is not None}}


async def serve_clustered(coord: Coordinator, queued: QueuedRequest, body: dict[str, Any],
                          ext: Extensions, here: Callable[[], Awaitable[Served]],
                          end: StreamEnd = openai_stream_end) -> Served:
    """Serve ``queued`` where the cluster says; ``here`` serves it on this member; ``end``
    closes a forwarded stream that fails midway, in the route's protocol."""
    cluster = coord.cluster
    if cluster is None or ext.forwarded or queued.endpoint not in FORWARDABLE:
        return await here()
    route = await cluster.route(queued.model_id, queued.priority)
    async with cluster.holding(route):
        if route.member is not None:
            sent = forward_body(body, ext, client_id=queued.client_id,
                                priority=queued.priority, budget_s=queued.budget_s)
            with contextlib.suppress(MemberUnreachable):  # then it is served here
                return await forward_to(coord, route.member, queued.endpoint,
                                        queued.model_id, sent, end)
        served = await here()
        served.headers[MEMBER_HEADER] = cluster.host_id
        return served


async def forward_to(coord: Coordinator, member: MemberRecord, endpoint: str, model_id: str,
                     body: dict[str, Any], end: StreamEnd = openai_stream_end) -> Served:
    """Send ``body`` on to ``member`` and pass its answer through (an error answer raised as
    the error it was there). A member that cannot be reached is forgotten until its next
    heartbeat, and :class:`MemberUnreachable` goes up: nothing was answered yet."""
    cluster = coord.cluster
    assert cluster is not None
    try:
        reply = await cluster.forwarder.forward(member, endpoint, body,
                                                bool(body.get("stream")))
    except MemberUnreachable as exc:
        log.warning("%s", exc)
        cluster.unreachable(member)
        raise
    headers = {MODEL_HEADER: model_id, MEMBER_HEADER: member.host_id}
    if reply.chunks is None and reply.status >= 400:
        raise member_error(reply.status, reply.body or b"", reply.retry_after)
    if reply.chunks is None:
        return Served(reply.status, headers, reply.content_type, body=reply.body or b"")
    return Served(reply.status, headers, reply.content_type,
                  chunks=_relay(reply.chunks, end))


# a member's refusal that says "this model cannot serve now": a task's next rung is worth a try
_FALLBACK_CODES = {"model_load_failed": LoadFailed, "model_unavailable": ModelUnavailable,
                   "worker_failed": WorkerCrashed, "capacity_exceeded": CapacityExceeded}


def member_error(status: int, body: bytes, retry_after: str | None) -> ModelBossError:
    """A member's error answer as the error it was there: same status, envelope and
    Retry-After, and the same class where the ladder falls back on it."""
    try:
        fields = orjson.loads(body)["error"]
        message, code = str(fields["message"]), fields.get("code")
    except (ValueError, KeyError, TypeError):
        fields, message, code = {}, "a cluster member failed the request", "upstream_error"
    try:
        retry_s = float(retry_after) if retry_after else None
    except ValueError:
        retry_s = None
    error = _FALLBACK_CODES.get(str(code), ModelBossError)(
        message, param=fields.get("param"), code=code, retry_after_s=retry_s,
        status_code=status)
    if fields.get("type"):
        error.error_type = str(fields["type"])
    return error


async def _relay(chunks: AsyncIterator[bytes], end: StreamEnd) -> AsyncIterator[bytes]:
    """Chunks as the member sent them; a member lost mid-stream ends it with an SSE error."""
    try:
        async for chunk in chunks:
            yield chunk
    except Exception as exc:  # the member went away mid-stream
        log.warning("forwarded stream failed: %s", exc)
        yield end(exc)
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
