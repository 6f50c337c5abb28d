"""The seams inside the slots room: what a slot's owner asks of the pool it lives in, and what
a load and the CPU tier ask of an owner. Small protocols, so the owner does not import the
pool nor the load its owner (no import circles, type-only ones included); the pool and
:class:`~.owner.SlotOwner` are the implementations."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from ..backends.base import InferenceBackend
from ..catalog import Catalog, CatalogEntry
from ..events import EventBus
from ..gpu.boss import GPUBoss
from ..gpu.estimate import VramEstimate
from ..gpu.lease import Lease
from ..gpu.placement import LayerCosts, Placement
from ..scheduling.learned import LearnedStats
from ..scheduling.planner import Plan
from ..slot_key import SlotKey
from .slot import ModelSlot


class RamBudget(Protocol):
    """The CPU-RAM tier as an owner about to park its pipeline sees it."""

    def ram_available_mb(self) -> int: ...

    async def make_room(self, need_mb: int, exclude: str) -> bool: ...


class SlotOperator(Protocol):
    """What a load (its owner's operation) and the CPU tier ask of a slot's owner."""

    slot: ModelSlot
    pool: SlotHost

    @property
    def model_id(self) -> str: ...

    @property
    def key(self) -> SlotKey: ...

    @property
    def busy(self) -> bool: ...

    def worker_exited(self, backend: InferenceBackend, code: int) -> None: ...

    async def stop_worker(self, reason: str, event: str = "unloaded") -> str: ...

    async def unload(self, reason: str = "unload requested", *, wait_s: float = 0.0,
                     wait_for_op: bool = False,
                     only_if: Callable[[ModelSlot], bool] | None = None) -> bool: ...


class SlotHost(Protocol):
    """What a slot's owner and its loads ask of the pool they live in."""

    events: EventBus
    catalog: Catalog
    learned: LearnedStats
    cpu_tier: RamBudget
    boss: GPUBoss
    on_change: Callable[[], None]

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task: ...

    def estimate(self, entry: CatalogEntry) -> VramEstimate: ...

    def footprint_mb(self, slot: ModelSlot) -> int: ...

    def layer_costs(self, entry: CatalogEntry) -> LayerCosts | None: ...

    async def plan(self, key: SlotKey, priority: int) -> Plan: ...

    def new_backend(self, entry: CatalogEntry) -> InferenceBackend: ...

    async def make_room(self, owner: SlotOperator, priority: int,
                        ) -> tuple[Lease | None, Placement | None]: ...

    async def release_lease(self, lease: Lease | None, model_id: str) -> None: ...

    async def learn_footprint(self, slot: ModelSlot, backend: InferenceBackend) -> None: ...
