"""Serving in a cluster: here, or forwarded to the member the cluster names.

A request that arrived as a forward is always served here (one hop at most). A forward
carries the request's priority, client id, keep-alive, budget left and other ``x_*`` fields
in its body; its answer passes through untouched, a stream chunk by chunk. A member that
cannot be reached is forgotten until its next heartbeat and the request is served here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson

from ..cluster import MEMBER_HEADER, MemberRecord, MemberUnreachable
from ..endpoints import (
    CHAT,
    COMPLETIONS,
    COUNT_TOKENS,
    EMBEDDINGS,
    MESSAGES,
    RERANK,
    RESPONSES,
    SPEECH,
)
from ..errors import CapacityExceeded, LoadFailed, ModelBossError, ModelUnavailable, WorkerCrashed
from ..observability import tracing
from ..scheduling.queue import QueuedRequest
from ..slots.drain import SHUTTING_DOWN, ShuttingDown
from .extensions import Extensions
from .native import NATIVE_BODIES
from .served import MODEL_HEADER, Served, StreamEnd, openai_stream_end

if TYPE_CHECKING:
    from ..coordinator import Coordinator

log = logging.getLogger(__name__)

# the endpoints a member answers on the same path as the worker's (images are kept where
# they arrive: their files are served by the member that wrote them)
FORWARDABLE = frozenset({CHAT, COMPLETIONS, EMBEDDINGS, RERANK, RESPONSES, SPEECH, MESSAGES,
                         COUNT_TOKENS, *NATIVE_BODIES})


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
    if cluster is None or queued.endpoint not in FORWARDABLE:
        return await here()
    if ext.forwarded:  # if this member stops before its turn, the sender serves it
        return await _unless_handed_off(coord, queued, here, None)
    sent = forward_body(body, ext, client_id=queued.client_id, priority=queued.priority,
                        budget_s=queued.budget_s)
    route = await cluster.route(queued.model_id, queued.priority, queued.prefix)
    async with cluster.holding(route):
        if route.member is not None:
            with contextlib.suppress(MemberUnreachable):  # then it is served here
                return await forward_to(coord, route.member, queued.endpoint,
                                        queued.model_id, sent, end)

        async def elsewhere() -> Served:  # this member stops: another takes it
            member = cluster.elsewhere(queued.model_id, queued.priority, queued.prefix)
            if member is not None:
                with contextlib.suppress(MemberUnreachable):
                    return await forward_to(coord, member, queued.endpoint, queued.model_id,
                                            sent, end)
            return await here()  # nobody else: its turn here, within the grace

        served = await _unless_handed_off(coord, queued, here, elsewhere)
        served.headers.setdefault(MEMBER_HEADER, cluster.host_id)
        return served


async def _unless_handed_off(coord: Coordinator, queued: QueuedRequest,
                             here: Callable[[], Awaitable[Served]],
                             elsewhere: Callable[[], Awaitable[Served]] | None) -> Served:
    """``here()``, unless this member's drain hands the request off before its turn comes
    (:class:`~model_boss.slots.drain.Drain`): then ``elsewhere()`` serves it on another
    member; with none (a forward) it is refused with 503 ``shutting_down``, and the member
    that sent it serves it itself (:func:`forward_to`)."""
    drain, cluster = coord.drain, coord.cluster
    task = asyncio.current_task()
    assert task is not None and cluster is not None

    def before_its_turn() -> bool:
        return not queued.future.done() and (
            elsewhere is None or cluster.elsewhere(queued.model_id, queued.priority) is not None)

    drain.handable[task] = before_its_turn
    try:
        return await here()
    except asyncio.CancelledError:
        if task not in drain.handed or task.uncancel() > 0:
            raise
    finally:
        drain.handable.pop(task, None)
    drain.handed.discard(task)
    coord.events.emit("handed_off", model=queued.model_id, client=queued.client_id,
                      to="sender" if elsewhere is None else "another member")
    if elsewhere is None:
        raise ShuttingDown("this member is shutting down; the member that forwarded the "
                           "request serves it")
    return await elsewhere()


async def forward_to(coord: Coordinator, member: MemberRecord, endpoint: str, model_id: str,
                     body: dict[str, Any], end: StreamEnd = openai_stream_end) -> Served:
    """Send ``body`` on to ``member`` and pass its answer through (an error answer raised as
    the error it was there). A member that cannot be reached is forgotten until its next
    heartbeat, and :class:`MemberUnreachable` goes up: nothing was answered yet."""
    cluster = coord.cluster
    assert cluster is not None
    # the member's own spans are this one's children: its request carries it as traceparent
    with tracing.span("model_boss.forward", {"model_boss.member": member.host_id,
                                             "url.path": endpoint,
                                             "gen_ai.request.model": model_id},
                      client=True) as forwarding:
        try:
            reply = await cluster.forwarder.forward(member, endpoint, body,
                                                    bool(body.get("stream")))
        except MemberUnreachable as exc:
            log.warning("%s", exc)
            cluster.unreachable(member)
            tracing.failed(forwarding, exc)
            raise
    headers = {MODEL_HEADER: model_id, MEMBER_HEADER: member.host_id}
    if reply.chunks is None and reply.status >= 400:
        error = member_error(reply.status, reply.body or b"", reply.retry_after)
        if error.code == SHUTTING_DOWN:  # it stops: as if unreachable, so served elsewhere
            log.info("cluster: member %s is shutting down; served elsewhere", member.host_id)
            cluster.membership.forget(member.host_id)
            raise MemberUnreachable(f"member {member.host_id} is shutting down")
        raise error
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
