"""What each model has waiting and running, read off its slot and the queue, for the
metrics an inference gateway's picker reads (:mod:`model_boss.observability.gateway`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from ..slot_key import SlotKey
from ..slots.slot import ModelSlot, SlotState
from .gateway import ModelLoad


async def model_loads(slots: Mapping[SlotKey, ModelSlot],
                      waiting: Mapping[str, int]) -> list[ModelLoad]:
    """Every model with a slot or a waiter (``waiting``: the queue's count by model): its
    waiting and running requests, its worker's KV-cache use where a ready worker counts it
    (read from all ready workers at once), and its adapters. The adapters count as running
    while its worker is ready, since it loads them all; which adapter a waiting request asked
    for is not kept, so none are shown waiting."""
    ready = {key: slot.backend for key, slot in slots.items()
             if slot.state == SlotState.READY and slot.backend is not None}
    usages = await asyncio.gather(*(backend.kv_cache_usage() for backend in ready.values()),
                                  return_exceptions=True)  # a failed read: no series
    kv_cache: dict[str, list[float]] = {}  # by model: each ready copy's (replicas: the mean)
    for key, usage in zip(ready, usages, strict=True):
        if isinstance(usage, float):
            kv_cache.setdefault(slots[key].model_id, []).append(usage)
    copies: dict[str, list[ModelSlot]] = {}
    for slot in slots.values():
        copies.setdefault(slot.model_id, []).append(slot)
    warm = {slots[key].model_id for key in ready}
    loads = []
    for model_id in sorted(set(copies) | set(waiting)):
        found = copies.get(model_id, [])
        adapters = tuple(adapter.id for adapter in found[0].entry.adapters) if found else ()
        usage = kv_cache.get(model_id)
        loads.append(ModelLoad(
            model_id, waiting=waiting.get(model_id, 0), running=sum(s.active for s in found),
            kv_cache_usage=sum(usage) / len(usage) if usage else None, adapters=adapters,
            running_adapters=adapters if model_id in warm else ()))
    return loads


def model_totals(slots: Iterable[ModelSlot]) -> list[tuple[str, int, int]]:
    """Per model: requests running over its copies, and how many may (each READY copy's
    limit; one copy's while none is READY)."""
    running: dict[str, int] = {}
    ready: dict[str, int] = {}
    one: dict[str, int] = {}
    for slot in slots:
        model, limit = slot.model_id, slot.entry.manifest.running_limit
        running[model] = running.get(model, 0) + slot.active
        ready[model] = ready.get(model, 0) + (limit if slot.state == SlotState.READY else 0)
        one[model] = limit
    return [(model, running[model], ready[model] or one[model]) for model in sorted(running)]
