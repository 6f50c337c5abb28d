"""ModelSlot: one model's place in the pool — its lease, its worker, its lifecycle."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..catalog import CatalogEntry
from ..catalog.context import context_view
from ..errors import ModelBossError
from ..events import EventBus
from ..gpu.estimate import VramEstimate
from ..gpu.lease import Lease
from ..gpu.placement import Placement
from ..scheduling.states import SlotState
from ..slot_key import SlotKey, slot_key

if TYPE_CHECKING:
    from ..backends.base import InferenceBackend

log = logging.getLogger(__name__)


S = SlotState
# The one transition table. A crash or a lost lease takes any state with a worker to IDLE.
TRANSITIONS: dict[SlotState, frozenset[SlotState]] = {
    S.IDLE: frozenset({S.LOADING}),
    S.LOADING: frozenset({S.READY, S.IDLE, S.STOPPING}),
    S.READY: frozenset({S.DRAINING, S.OFFLOADING, S.STOPPING, S.IDLE}),
    S.DRAINING: frozenset({S.READY, S.OFFLOADING, S.STOPPING, S.IDLE}),
    S.OFFLOADING: frozenset({S.OFFLOADED, S.STOPPING, S.IDLE}),
    S.OFFLOADED: frozenset({S.LOADING, S.STOPPING, S.IDLE}),
    S.STOPPING: frozenset({S.IDLE}),
}
# States in which the slot's worker process exists.
WITH_WORKER = frozenset({S.READY, S.DRAINING, S.OFFLOADING, S.OFFLOADED})


class IllegalTransition(ModelBossError):
    code = "illegal_slot_transition"


@dataclass(eq=False)
class ModelSlot:
    """State and eviction metadata for one model. Transitions go through :meth:`transition`."""

    entry: CatalogEntry
    events: EventBus
    state: SlotState = SlotState.IDLE
    backend: InferenceBackend | None = None
    lease: Lease | None = None
    placement: Placement | None = None
    estimate: VramEstimate | None = None
    port: int | None = None
    last_used: float = 0.0
    last_priority: int = 100
    stay_warm_s: float = 300.0
    unload_at: float | None = None
    pinned: bool = False
    active: int = 0
    loads: int = 0
    last_load_s: float | None = None
    last_onload_s: float | None = None
    loaded_at: float | None = None
    ready_in_s: float = 0.0  # how long its last load or onload took (charged to a request)
    measured_mb: int | None = None
    last_error: str | None = None
    ram_reserved_mb: int = 0
    # the GPUs its worker process was started with (CUDA_VISIBLE_DEVICES): the only ones a
    # parked worker can onload to
    worker_gpus: tuple[int, ...] | None = None
    unload_after_request: bool = False
    # open realtime sessions keeping it warm: holder (a session id) -> the session's priority
    holds: dict[str, int] = field(default_factory=dict)
    replica: int = 1  # its place among the model's copies (docs/SCHEDULING.md, replicas)
    history: list[tuple[float, str, str]] = field(default_factory=list)

    @property
    def leased_mb(self) -> int:
        """The VRAM its lease holds now (0 without one)."""
        return self.lease.vram_mb if self.lease is not None else 0

    @property
    def model_id(self) -> str:
        return self.entry.manifest.id

    @property
    def key(self) -> SlotKey:
        """Its name in the pool and on its lease: the model's id, ``id#n`` for replica n."""
        return slot_key(self.model_id, self.replica)

    @property
    def parallel(self) -> int:
        return self.entry.manifest.concurrency

    def transition(self, new: SlotState, reason: str = "") -> None:
        """Move to ``new`` if the table allows it; log and emit an event either way."""
        old = self.state
        if new not in TRANSITIONS[old]:
            raise IllegalTransition(f"slot {self.model_id}: {old} -> {new} is not allowed")
        self.state = new
        self.history.append((time.time(), f"{old}->{new}", reason))
        del self.history[:-50]
        self.events.emit("slot_state", model=self.model_id, old=str(old), new=str(new),
                         reason=reason)

    # -- eviction metadata ----------------------------------------------------------------

    def adopt(self, entry: CatalogEntry, stay_warm_s: float) -> None:
        """The catalog's new entry for this model (a reload): its pin, stay-warm, priority and
        limits apply now; what the worker runs with applies at its next load."""
        if entry.manifest.pin != self.entry.manifest.pin:
            self.pinned = entry.manifest.pin
        self.entry = entry
        self.stay_warm_s = stay_warm_s
        self.refresh_unload_at()

    def touch(self, priority: int, now: float | None = None) -> None:
        now = now if now is not None else time.time()
        self.last_used = now
        self.last_priority = priority
        self.refresh_unload_at(now)

    def granted(self, priority: int, keep_alive_s: float | None) -> None:
        """A request starts: 0 = unload after it, < 0 = until evicted, > 0 = that long."""
        self.touch(priority)
        if keep_alive_s is not None:
            if keep_alive_s == 0:
                self.unload_after_request = True
            elif keep_alive_s < 0:
                self.unload_at = None
            else:
                self.unload_at = time.time() + keep_alive_s

    def finished(self, priority: int, keep_alive_s: float | None) -> None:
        """A request ended: the stay-warm clock restarts (or its keep-alive does)."""
        if keep_alive_s is None or keep_alive_s > 0:
            self.touch(priority)
            if keep_alive_s is not None:
                self.unload_at = time.time() + keep_alive_s
        else:
            self.last_used = time.time()
            if keep_alive_s < 0:
                self.unload_at = None

    @property
    def held_priority(self) -> int | None:
        """The most important priority among its holders (None: nobody holds it)."""
        return min(self.holds.values()) if self.holds else None

    def refresh_unload_at(self, now: float | None = None) -> None:
        now = now if now is not None else time.time()
        if self.pinned or self.holds or self.stay_warm_s < 0:
            self.unload_at = None
        else:
            self.unload_at = now + self.stay_warm_s

    def expired(self, now: float) -> bool:
        return (not self.pinned and not self.holds and self.active == 0
                and self.unload_at is not None
                and now >= self.unload_at)

    @property
    def evictable_state(self) -> bool:
        return self.state in (SlotState.READY, SlotState.OFFLOADED)

    @property
    def tier(self) -> str:
        if self.state in (S.READY, S.DRAINING, S.OFFLOADING):
            return "gpu"
        return "cpu" if self.state == S.OFFLOADED else "disk"

    def to_dict(self) -> dict[str, Any]:
        manifest = self.entry.manifest
        return {
            "model": self.model_id,
            "replica": self.replica,
            "key": self.key,
            "category": str(manifest.category),
            "backend": str(manifest.backend),
            "state": str(self.state),
            "tier": self.tier,
            "pid": self.backend.pid if self.backend else None,
            "port": self.port,
            "pinned": self.pinned,
            "held_by": sorted(self.holds),
            "active_requests": self.active,
            "parallel": self.parallel, **context_view(manifest),
            "vram_estimate": self.estimate.to_dict() if self.estimate else None,
            "measured_mb": self.measured_mb,
            "lease": self.lease.to_dict() if self.lease else None,
            "placement": self.placement.to_dict() if self.placement else None,
            "last_used": self.last_used or None,
            "last_priority": self.last_priority,
            "stay_warm_s": self.stay_warm_s,
            "unload_at": self.unload_at,
            "loads": self.loads,
            "last_load_s": self.last_load_s,
            "last_onload_s": self.last_onload_s,
            "loaded_at": self.loaded_at,
            "last_error": self.last_error,
            "ram_reserved_mb": self.ram_reserved_mb,
            # LoRA adapters served on this worker, and its draft model
            "adapters": [adapter.id for adapter in self.entry.adapters],
            "draft": manifest.draft,
        }
