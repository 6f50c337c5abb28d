"""The CPU-RAM tier: how much RAM parked pipelines may take, and making room for one more.

A slot whose backend can offload (the diffusers worker) goes READY → OFFLOADED instead of being
stopped when the RAM budget allows — psutil's available memory minus ``ram_reserve_mb``, capped
by ``max_offloaded_mb``. Its VRAM lease is released and a RAM reservation recorded; the next
request onloads the same worker process. When RAM runs short, the least recently used offloaded
slot is stopped (the disk tier). The moves themselves are the slot owners'; this component only
keeps the budget and picks whom to stop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import psutil

from ..slot_key import SlotKey
from .slot import SlotState

if TYPE_CHECKING:
    from ..settings import Settings
    from .host import SlotOperator


class CpuTier:
    """The RAM budget for offloaded pipelines, over the pool's slot owners."""

    def __init__(self, settings: Settings, owners: Mapping[SlotKey, SlotOperator]) -> None:
        self.settings = settings
        self.owners = owners

    def offloaded_mb(self) -> int:
        return sum(o.slot.ram_reserved_mb for o in self.owners.values()
                   if o.slot.state == SlotState.OFFLOADED)

    def ram_available_mb(self) -> int:
        """RAM that offloaded pipelines may still take: psutil available − reserve, capped."""
        available = psutil.virtual_memory().available // 2**20 - self.settings.ram_reserve_mb
        cap = self.settings.max_offloaded_mb
        if cap is not None:
            available = min(available, cap - self.offloaded_mb())
        return int(available)

    async def make_room(self, need_mb: int, exclude: str) -> bool:
        """Stop least recently used offloaded slots until ``need_mb`` fits in the budget.
        Slots busy with an operation of their own are skipped, never waited for."""
        tried: set[str] = set()
        while self.ram_available_mb() < need_mb:
            parked = sorted((o for o in self.owners.values()
                             if o.slot.state == SlotState.OFFLOADED and o.model_id != exclude
                             and o.model_id not in tried and not o.slot.pinned and not o.busy),
                            key=lambda o: o.slot.last_used)
            if not parked:
                return False
            tried.add(parked[0].model_id)
            await parked[0].unload("RAM budget: least recently used offloaded slot")
        return True
