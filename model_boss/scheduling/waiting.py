"""The waiting line as clients see it: position, wait so far, and when a request may start.

Positions come from :meth:`InferenceQueue.ordered` (the dispatcher's own order), so they stay
right whatever that order is made of. The estimated start uses the learned load and inference
times the budget admission uses (:func:`budget.predict`).
"""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime
from typing import Any

from .budget import predict
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


def queue_place(queue: InferenceQueue, request_id: str) -> dict[str, Any]:
    """``queue_position`` and ``estimated_start`` (ISO time) of a waiting request; both None
    when it is not waiting here."""
    order = queue.ordered()
    for position, request in enumerate(order, 1):
        if request.request_id == request_id:
            start = time.time() + start_in_s(queue, request, order[:position - 1])
            return {"queue_position": position,
                    "estimated_start": datetime.fromtimestamp(start, UTC).isoformat(
                        timespec="seconds")}
    return {"queue_position": None, "estimated_start": None}


def start_in_s(queue: InferenceQueue, request: QueuedRequest,
               ahead: list[QueuedRequest]) -> float:
    """Seconds until ``request`` may start: the requests ahead of it on the same model (and
    those running there), served ``parallel`` at a time, plus what is left of its load."""
    pool, model = queue.pool, request.model_id
    slot = pool.slots.get(model)
    warm = slot is not None and slot.state == SlotState.READY
    size = 0
    if not warm:
        entry = pool.catalog.find(model)
        size = pool.estimate(entry).mb if entry else 0
    load_s = pool.learned.predicted_load_s(model, size)
    owner = pool.owners.get(model)
    progress = owner.progress if owner is not None else None
    prediction = predict(
        warm=warm, loading=progress is not None,
        ahead=(slot.active if slot else 0) + sum(1 for r in ahead if r.model_id == model),
        parallel=slot.parallel if slot else 1, load_s=load_s,
        infer_s=pool.learned.predicted_infer_s(model))
    load_left = prediction.load_s
    if progress is not None:  # a load under way: what the learned time leaves of it
        load_left = max(0.0, load_s - progress.elapsed_s())
    return prediction.wait_s + load_left
