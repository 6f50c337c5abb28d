"""What each model has waiting and running, read off its slot and the queue, for the
metrics an inference gateway's picker reads (:mod:`model_boss.gateway`)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from ..gateway import ModelLoad
from .slot import ModelSlot, SlotState


async def model_loads(slots: Mapping[str, ModelSlot],
                      waiting: Mapping[str, int]) -> list[ModelLoad]:
    """Every model with a slot or a waiter (``waiting``: the queue's count by model): its
    waiting and running requests, its worker's KV-cache use where a ready worker counts it
    (read from all ready workers at once), and its adapters. The adapters count as running
    while its worker is ready, since it loads them all; which adapter a waiting request asked
    for is not kept, so none are shown waiting."""
    ready = {model_id: slot.backend for model_id, slot in slots.items()
             if slot.state == SlotState.READY and slot.backend is not None}
    usages = await asyncio.gather(*(backend.kv_cache_usage() for backend in ready.values()),
                                  return_exceptions=True)  # a failed read: no series
    kv_cache = {model_id: usage for model_id, usage in zip(ready, usages, strict=True)
                if isinstance(usage, float)}
    loads = []
    for model_id in sorted(set(slots) | set(waiting)):
        slot = slots.get(model_id)
        adapters = tuple(adapter.id for adapter in slot.entry.adapters) if slot else ()
        loads.append(ModelLoad(
            model_id, waiting=waiting.get(model_id, 0), running=slot.active if slot else 0,
            kv_cache_usage=kv_cache.get(model_id), adapters=adapters,
            running_adapters=adapters if model_id in ready else ()))
    return loads
