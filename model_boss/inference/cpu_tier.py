"""The CPU-RAM tier of the pool: park evicted pipelines in RAM, bring them back on demand.

A slot whose backend can offload (the diffusers worker) goes READY → OFFLOADED instead of being
stopped when the RAM budget allows — psutil's available memory minus ``ram_reserve_mb``, capped
by ``max_offloaded_mb``. Its VRAM lease is released and a RAM reservation recorded; the next
request onloads the same worker process. When RAM runs short, the least recently used offloaded
slot is stopped (the disk tier).
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

import psutil

from .slot import ModelSlot, SlotState

if TYPE_CHECKING:
    from ..events import EventBus
    from ..settings import Settings


class CpuTier:
    """Mixed into :class:`~model_boss.inference.pool.ModelPool`; uses its slots, settings,
    events, ``_stop`` and ``_release_lease``. Called with the pool lock held."""

    slots: dict[str, ModelSlot]
    settings: Settings
    events: EventBus

    async def _onload(self, slot: ModelSlot, priority: int) -> ModelSlot:
        """OFFLOADED → READY in the same worker (called under the pool lock, lease held)."""
        started = time.monotonic()
        try:
            assert slot.backend is not None
            report = await slot.backend.onload()
        except BaseException as exc:
            await self._release_lease(slot)
            self.events.emit("onload_failed", model=slot.model_id, error=str(exc))
            if slot.state == SlotState.OFFLOADED:  # the worker is unusable: stop it
                slot.transition(SlotState.STOPPING, "onload failed")
                backend, slot.backend = slot.backend, None
                if backend is not None:
                    with contextlib.suppress(Exception):
                        await backend.stop()
                slot.ram_reserved_mb = 0
                slot.transition(SlotState.IDLE, "onload failed")
            raise
        seconds = round(time.monotonic() - started, 3)
        slot.ram_reserved_mb = 0
        slot.last_onload_s = seconds
        slot.transition(SlotState.READY, f"onloaded in {seconds}s")
        slot.touch(priority)
        self.events.emit("onloaded", model=slot.model_id, seconds=seconds,
                         worker_seconds=report.get("seconds"))
        return slot

    def ram_available_mb(self) -> int:
        """RAM that offloaded pipelines may still take: psutil available − reserve, capped."""
        available = psutil.virtual_memory().available // 2**20 - self.settings.ram_reserve_mb
        cap = self.settings.max_offloaded_mb
        if cap is not None:
            available = min(available, cap - self.offloaded_mb())
        return int(available)

    def offloaded_mb(self) -> int:
        return sum(s.ram_reserved_mb for s in self.slots.values()
                   if s.state == SlotState.OFFLOADED)

    def _footprint_mb(self, slot: ModelSlot) -> int:
        if slot.measured_mb:
            return slot.measured_mb
        return slot.estimate.mb if slot.estimate else self.estimate(slot.entry).mb

    async def _make_ram_room(self, need_mb: int, exclude: str) -> bool:
        """Stop least recently used offloaded slots until ``need_mb`` fits in the RAM budget."""
        while self.ram_available_mb() < need_mb:
            parked = sorted((s for s in self.slots.values()
                             if s.state == SlotState.OFFLOADED and s.model_id != exclude
                             and not s.pinned and s.active == 0),
                            key=lambda s: s.last_used)
            if not parked:
                return False
            await self._stop(parked[0], "RAM budget: least recently used offloaded slot")
        return True

    async def _offload(self, slot: ModelSlot, reason: str) -> bool:
        """READY → OFFLOADED: weights to CPU RAM, VRAM lease released. False → not possible."""
        backend = slot.backend
        if backend is None or not getattr(backend, "can_offload", False) \
                or slot.state != SlotState.READY or slot.active:
            return False
        need = self._footprint_mb(slot)
        if not await self._make_ram_room(need, exclude=slot.model_id):
            self.events.emit("offload_skipped", model=slot.model_id, need_mb=need,
                             ram_available_mb=self.ram_available_mb())
            return False
        started = time.monotonic()
        try:
            report = await backend.offload()
        except Exception as exc:
            self.events.emit("offload_failed", model=slot.model_id, error=str(exc))
            return False
        slot.transition(SlotState.OFFLOADED, reason)
        slot.ram_reserved_mb = need
        await self._release_lease(slot)
        self.events.emit("offloaded", model=slot.model_id, reason=reason, ram_mb=need,
                         seconds=round(time.monotonic() - started, 3),
                         freed_mb=report.get("freed_mb"))
        self.on_change()
        return True

