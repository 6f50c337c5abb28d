"""The pool as ``/api/v1/status`` shows it: each slot (every replica its own row), the
operation in flight, what was learned of its model, and where it runs (``ollama ps``'s
PROCESSOR)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from ..catalog import BackendKind
from ..gpu.estimate import VramEstimate
from ..gpu.gguf_info import read_gguf_info
from ..gpu.processor import ProcessorSplit, processor_split
from ..gpu.safetensors_info import model_layers
from ..scheduling.learned import LearnedStats
from ..slot_key import SlotKey
from .owner import SlotOwner
from .slot import ModelSlot


class PoolReading(Protocol):
    """What the status reads of the pool (:class:`~.pool.ModelPool`)."""

    owners: Mapping[SlotKey, SlotOwner]
    learned: LearnedStats
    prompt_cache: Any
    boss: Any

    def estimate(self, entry: Any) -> VramEstimate: ...

    def footprint_mb(self, slot: ModelSlot) -> int: ...


def pool_status(pool: PoolReading) -> list[dict]:
    result = []
    for owner in pool.owners.values():
        slot = owner.slot
        data = slot.to_dict()
        data["operation"] = owner._op_kind if owner.busy else None
        progress = owner.progress
        data["load_progress"] = progress.snapshot() if progress else None
        data["waiters"] = owner.waiters
        if slot.estimate is None:
            with contextlib.suppress(Exception):
                data["vram_estimate"] = pool.estimate(slot.entry).to_dict()
        data["learned"] = asdict(pool.learned.get(slot.model_id))
        data["prompt_cache"] = pool.prompt_cache.stats(slot.model_id)
        with contextlib.suppress(Exception):  # a status read never fails on a bad file
            data["processor"] = processor(pool, slot).to_dict()
        result.append(data)
    return result


def processor(pool: PoolReading, slot: ModelSlot) -> ProcessorSplit:
    """Where the slot's model runs now: its lease, its worker's GPU layers out of the
    model's, and whether its GPUs are declared ones (``ollama ps``'s PROCESSOR)."""
    entry, lease = slot.entry, slot.lease
    allocations = lease.allocations if lease else {}
    layers_of = getattr(slot.backend, "gpu_layers", None)
    gpu_layers = layers_of(slot.placement) if callable(layers_of) else None
    total = slot.placement.total_layers if slot.placement else None
    if total is None and gpu_layers is not None and entry.path is not None:
        total = layer_count(entry.path)
    sources = {g.index: g.source for g in pool.boss.gpus}
    size = max(pool.footprint_mb(slot), slot.ram_reserved_mb)
    if slot.estimate is not None and slot.estimate.whole_mb:  # partly offloaded
        size = max(size, slot.estimate.whole_mb)
    return processor_split(
        tier=slot.tier, size_mb=size,
        leased_mb=sum(allocations.values()), gpu_layers=gpu_layers, total_layers=total,
        declared=bool(allocations) and all(sources.get(i) == "declared"
                                           for i in allocations),
        remote=entry.manifest.backend == BackendKind.CLOUD)


def layer_count(path: Path) -> int | None:
    """The model's layers: a GGUF's blocks, a transformers folder's repeated blocks."""
    if path.is_dir():
        layout = model_layers(path)
        return layout.count if layout else None
    info = read_gguf_info(path)
    return info.block_count if info else None
