"""Waiting for an evicted model's VRAM to come back, on conditions rather than timers.

After an eviction the next plan must not evict a second victim for memory that is only late:
with NVML, wait until the driver's free VRAM has risen by (nearly) what the victim held."""

from __future__ import annotations

import asyncio
import logging
import time

from ..gpu.boss import GPUBoss
from .slot import ModelSlot

log = logging.getLogger(__name__)

RECLAIM_POLL_S = 0.02  # NVML reads while waiting for an evicted model's VRAM to come back
RECLAIMED_SHARE = 0.9  # of the evicted lease: leases are estimates, the driver's figure is not


def held_vram(slot: ModelSlot) -> dict[int, int]:
    """VRAM per GPU an eviction of ``slot`` should give back: its lease, scaled down to what
    its worker measured when that is less (a lease is an estimate)."""
    held = dict(slot.lease.allocations) if slot.lease else {}
    total = sum(held.values())
    if slot.measured_mb and 0 < slot.measured_mb < total:
        held = {gpu: mb * slot.measured_mb // total for gpu, mb in held.items()}
    return held


async def driver_free(boss: GPUBoss) -> dict[int, int]:
    """What the driver (NVML) says is free per GPU; {} without NVML."""
    if boss.nvml is None:
        return {}
    return {u.index: u.nvml_free_mb for u in await boss.usage() if u.nvml_free_mb is not None}


async def wait_reclaimed(boss: GPUBoss, limit_s: float, tier: str, held: dict[int, int],
                         before: dict[int, int]) -> None:
    """Until the driver has the victim's VRAM back. With NVML: poll until the driver's free
    VRAM has risen by (nearly) what the victim's lease held, for at most ``limit_s``
    (``reclaim_sleep_s``). Without NVML there is nothing to watch: a parked pipeline's worker
    answered its offload after emptying its CUDA cache, so nothing is waited for; a stopped
    worker's VRAM may come back a moment after its process is gone, so that waits
    ``limit_s``."""
    if limit_s <= 0 or not held:
        return
    if not before:
        if tier == "disk":
            await asyncio.sleep(limit_s)
        return
    deadline = time.monotonic() + limit_s
    while True:
        now = await driver_free(boss)
        if all(now.get(gpu, 0) - before.get(gpu, 0) >= mb * RECLAIMED_SHARE
               for gpu, mb in held.items()):
            return
        if time.monotonic() >= deadline:
            log.info("driver shows less VRAM back than the evicted lease held after %.1fs;"
                     " re-planning anyway", limit_s)
            return
        await asyncio.sleep(RECLAIM_POLL_S)
