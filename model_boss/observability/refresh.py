"""The gauges ``GET /metrics`` reads fresh before it answers: the queue, the GPUs' leased and
free VRAM, each copy's slot state, each model's running requests and limit, and the
inference-gateway series."""

from __future__ import annotations

from ..gpu import GPUBoss
from ..scheduling.queue import InferenceQueue
from ..settings import Settings
from ..slots import ModelPool
from .metrics import Metrics
from .model_loads import model_loads, model_totals


async def refresh_metrics(m: Metrics, queue: InferenceQueue, boss: GPUBoss, pool: ModelPool,
                          settings: Settings) -> None:
    m.queue_depth.set(queue.depth)
    m.queue_limit.labels("total").set(settings.max_queue_depth)
    m.queue_limit.labels("per_client").set(settings.max_queued_per_client)
    m.queue_waiting.clear()
    for priority, count in queue.backlog.by_priority().items():
        m.queue_waiting.labels(str(priority)).set(count)
    for usage in await boss.usage():
        m.gpu_leased.labels(str(usage.index)).set(usage.leased_mb)
        m.gpu_free.labels(str(usage.index)).set(usage.free_mb)
    for slot in pool.slots.values():
        m.slot_in(slot.key, slot.state)
    for model_id, running, limit in model_totals(pool.slots.values()):
        m.model_max_concurrency.labels(model_id).set(limit)
        m.model_running.labels(model_id).set(running)
    m.gateway.update(await model_loads(pool.slots, queue.backlog.by_model()))
