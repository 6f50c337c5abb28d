"""The gauges ``GET /metrics`` reads fresh before it answers: the queue, the GPUs' leased and
free VRAM, each copy's slot state, each model's running requests and limit, and the
inference-gateway series."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..slots import SlotState, model_loads, model_totals

if TYPE_CHECKING:
    from ..coordinator import Coordinator


async def refresh_metrics(coord: Coordinator) -> None:
    m = coord.metrics
    m.queue_depth.set(coord.queue.depth)
    m.queue_limit.labels("total").set(coord.settings.max_queue_depth)
    m.queue_limit.labels("per_client").set(coord.settings.max_queued_per_client)
    m.queue_waiting.clear()
    for priority, count in coord.queue.backlog.by_priority().items():
        m.queue_waiting.labels(str(priority)).set(count)
    for usage in await coord.boss.usage():
        m.gpu_leased.labels(str(usage.index)).set(usage.leased_mb)
        m.gpu_free.labels(str(usage.index)).set(usage.free_mb)
    for slot in coord.pool.slots.values():  # each copy of a model as its own series
        for state in SlotState:
            m.slot_state.labels(slot.key, str(state)).set(int(slot.state == state))
    for model_id, running, limit in model_totals(coord.pool.slots.values()):
        m.model_max_concurrency.labels(model_id).set(limit)
        m.model_running.labels(model_id).set(running)
    m.gateway.update(await model_loads(coord.pool.slots, coord.queue.backlog.by_model()))
