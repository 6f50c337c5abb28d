"""The waiting line as clients see it: position, wait so far, and when a request may start.

Positions come from :meth:`InferenceQueue.ordered` (the dispatcher's own order), so they stay
right whatever that order is made of. The estimated start adds up the work ahead of a request
(what is left of the running requests and the waiting ones, each its asked length at its
model's learned rate) and, for a model not loaded, its load and the models it waits for
(:func:`start_in_s`).
"""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime
from typing import Any

from ..errors import ModelBossError
from ..slot_key import SlotKey, model_of, slot_key
from .planner import Evict, Wait
from .queue import InferenceQueue, QueuedRequest
from .states import SlotState


def waiting_list(queue: InferenceQueue, limit: int | None = None,
                 offset: int = 0) -> list[dict[str, Any]]:
    """``GET /api/v1/queue``'s rows, position 1 first: ``limit`` of them from position
    ``offset + 1`` (the order is walked only that far)."""
    now = time.time()
    stop = None if limit is None else offset + limit
    page = itertools.islice(enumerate(queue.in_order(), 1), offset, stop)
    return [{"request_id": r.request_id, "model": r.model_id, "priority": r.priority,
             "client_id": r.client_id, "position": position,
             "waited_s": round(now - r.submitted_at, 3),
             "deadline_in_s": round(r.deadline - now, 3), "endpoint": r.endpoint}
            for position, r in page]


def queue_status(queue: InferenceQueue, shown: int = 50) -> dict[str, Any]:
    """The queue in ``/api/v1/status``: depth, counts by model and priority, the first
    ``shown`` waiters in order (a page of ``GET /api/v1/queue`` has the rest), the clients
    and the failing models. Its cost grows with ``shown`` and the clients, not the depth."""
    return {
        "depth": queue.depth,
        "granted_total": queue.granted_total,
        "by_model": queue.backlog.by_model(),
        "by_priority": queue.backlog.by_priority(),
        "waiting": waiting_list(queue, shown),  # the rows of GET /api/v1/queue
        "clients": queue.requestors.to_list(),
        "failing_models": queue.requestors.models_failing(),
    }


async def queue_place(queue: InferenceQueue, request_id: str) -> dict[str, Any]:
    """``queue_position`` and ``estimated_start`` (ISO time, to the millisecond) of a waiting
    request; both None when it is not waiting here."""
    order = queue.ordered()
    for position, request in enumerate(order, 1):
        if request.request_id == request_id:
            start = time.time() + await start_in_s(queue, request, order[:position - 1])
            return {"queue_position": position,
                    "estimated_start": datetime.fromtimestamp(start, UTC).isoformat(
                        timespec="milliseconds")}
    return {"queue_position": None, "estimated_start": None}


async def start_in_s(queue: InferenceQueue, request: QueuedRequest,
                     ahead: list[QueuedRequest]) -> float:
    """Seconds until ``request`` may start, from the work ahead of it and each model's
    learned rate (:meth:`LearnedStats.predicted_infer_s`: a request's asked length times the
    seconds per unit, else its model's mean request):

    - on its own model: what is left of the requests running on its serving copies (their
      expected time less what they have run) and the requests ahead of it there, ``parallel``
      at a time on each of those copies;
    - when its model is not loaded, what is left of its load, and, when it does not fit
      beside the others, the models it waits for (the planner's: the busy ones it must
      evict, drained of the work ahead) and the other models ahead of it that must load and
      run in turn first."""
    pool, model = queue.pool, request.model_id
    first = slot_key(model)  # the model's first copy
    now = time.monotonic()

    def drain_s(key: SlotKey) -> float:
        """How long the copy ``key`` stays busy with what runs there and what is ahead for
        its model, shared with its model's other serving copies (any of them takes the next
        of its requests; the learned figures are the model's)."""
        learned, of = pool.learned, model_of(key)
        copies = {key, *_serving(pool, of)}
        running = sum(max(0.0, learned.predicted_infer_s(of, t.request.work)
                          - (now - t.started)) for c in copies for t in queue.meter.running(c))
        queued = sum(learned.predicted_infer_s(of, r.work) for r in ahead if r.model_id == of)
        slots = [pool.slots.get(c) for c in copies]
        return (running + queued) / max(1, sum(max(1, s.parallel if s else 1) for s in slots))

    serving = _serving(pool, model)
    if serving:
        return drain_s(serving[0])
    owner = pool.owners.get(first)
    progress = owner.progress if owner is not None else None
    load_s = _load_s(pool, model)
    if progress is not None:  # its load is under way: what the learned time leaves of it
        return max(0.0, load_s - progress.elapsed_s()) + drain_s(first)
    return await _room_s(queue, request, ahead, drain_s) + load_s + drain_s(first)


def _serving(pool: Any, model: str) -> list[SlotKey]:
    """The model's READY copies."""
    return [o.slot.key for o in pool.replicas(model) if o.slot.state == SlotState.READY]


def _load_s(pool: Any, model: str) -> float:
    entry = pool.catalog.find(model)
    size = pool.estimate(entry).mb if entry else 0
    return pool.learned.predicted_load_s(model, size)


async def _room_s(queue: InferenceQueue, request: QueuedRequest, ahead: list[QueuedRequest],
                  drain_s: Any) -> float:
    """Until a model that is not loaded has its room: none when it fits now or its victims
    are idle; else the busy models it waits for drained, and before it the other models
    ahead that must load and run in their turn."""
    pool, first = queue.pool, slot_key(request.model_id)
    try:
        plan = await pool.plan(first, request.priority)
    except ModelBossError:  # unknown or unservable: it fails, it does not wait
        return 0.0
    if isinstance(plan, Evict):
        return max((drain_s(victim) for victim in plan.victims), default=0.0)
    if not isinstance(plan, Wait):
        return 0.0
    resident = {key for key, slot in pool.slots.items()
                if slot.state not in (SlotState.IDLE, SlotState.STOPPING)}
    blocking = plan.blocking or tuple(key for key in resident if key != first)
    waited = max((drain_s(key) for key in blocking), default=0.0)
    # the other models ahead with no copy resident load and run in turn before it
    before = {r.model_id for r in ahead} - {model_of(key) for key in resident} \
        - {request.model_id}
    return waited + sum(_load_s(pool, name) + drain_s(slot_key(name)) for name in before)
