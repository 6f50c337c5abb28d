"""What the queue, the router and the waiting line read of the slots, as protocols. The slots
room implements them (:class:`~model_boss.slots.pool.ModelPool`,
:class:`~model_boss.slots.owner.SlotOwner`, :class:`~model_boss.slots.slot.ModelSlot`);
scheduling never imports it, so a decision cannot reach past its owner to act on a slot."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ..catalog import Catalog, CatalogEntry
from ..gpu.estimate import VramEstimate
from ..gpu.placement import Placement
from ..slot_key import SlotKey
from .learned import LearnedStats
from .planner import Plan
from .rates import RequestRates
from .states import SlotState


class SlotReading(Protocol):
    """One slot as scheduling reads it (never writes it)."""

    entry: CatalogEntry
    state: SlotState
    active: int
    parallel: int
    estimate: VramEstimate | None
    placement: Placement | None  # its GPUs and, partly offloaded, its layers there
    backend: Any  # the worker a granted request is sent to
    loaded_at: float | None  # when it last became READY from a load or an onload
    ready_in_s: float  # how long that load or onload took

    @property
    def leased_mb(self) -> int: ...

    @property
    def model_id(self) -> str: ...

    @property
    def key(self) -> SlotKey: ...  # the model's id, or ``id#n`` for its replica n


class LoadUnderWay(Protocol):
    def elapsed_s(self) -> float: ...


class SlotGate(Protocol):
    """A slot's owner as the queue asks it: grants and releases are synchronous (the check and
    the count with no await between them), loads are started, waiters counted."""

    slot: SlotReading

    @property
    def progress(self) -> LoadUnderWay | None: ...

    def try_acquire(self, priority: int, keep_alive_s: float | None = None) -> bool: ...

    def release(self, priority: int, keep_alive_s: float | None = None) -> None: ...

    def wait_begins(self) -> None: ...

    def wait_ends(self, gave_up: bool) -> None: ...

    def start_load(self, priority: int) -> asyncio.Task | None: ...


class SlotBoard(Protocol):
    """The pool as scheduling sees it: slots to read, owners to ask, the planner's answer."""

    catalog: Catalog
    learned: LearnedStats
    rates: RequestRates
    slots: Mapping[SlotKey, SlotReading]
    owners: Mapping[SlotKey, SlotGate]
    on_change: Callable[[], None]
    wanted: Callable[[], tuple[str, ...]]

    def owner(self, model_id: str) -> SlotGate: ...

    def replicas(self, model_id: str) -> list[SlotGate]: ...

    def add_replica(self, model_id: str) -> SlotGate: ...

    def prune_replicas(self) -> None: ...

    def estimate(self, entry: CatalogEntry) -> VramEstimate: ...

    def is_loading(self, key: SlotKey) -> bool: ...

    async def plan(self, key: SlotKey, priority: int) -> Plan: ...
