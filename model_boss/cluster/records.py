"""What one member publishes about itself: plain data, to and from JSON.

A :class:`MemberRecord` is the whole of what another member needs to route to this one:
where it is, its GPUs (free now and at most), and its slots as the planner sees them, so the
cheapest member for a cold model is chosen with the same pure :func:`plan` every member runs
on its own slots; and, per model, the prompt blocks its replicas were sent last, so a
conversation goes on where its prefix is cached.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..scheduling.eviction import SlotView
from ..scheduling.planner import Snapshot
from ..scheduling.states import SlotState
from ..slot_key import SlotKey


@dataclass(frozen=True, slots=True)
class SlotRecord:
    """One slot of a member: the evictor's view plus the counts routing weighs. ``model``
    is the copy's key (the model's id, ``id#n`` for its replica n)."""

    model: SlotKey
    state: str
    tier: str
    active: int = 0
    queued: int = 0  # the model's requests waiting on this member (the same on each copy)
    parallel: int = 1
    pinned: bool = False
    last_used: float = 0.0
    last_priority: int = 5
    unload_at: float | None = None
    allocations: dict[int, int] = field(default_factory=dict)
    reload_s: float = 0.0  # the evictor's cost figures (see SlotView)
    rate_per_s: float = 0.0
    oldest_wait_s: float = 0.0  # how long the model's first waiter here had waited (0: none)

    @property
    def parallel_free(self) -> int:
        return max(0, self.parallel - self.active) if self.state == SlotState.READY else 0

    def view(self) -> SlotView:
        return SlotView(self.model, self.state, self.pinned, self.active, self.last_used,
                        self.last_priority, self.unload_at, dict(self.allocations),
                        self.reload_s, self.rate_per_s)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["allocations"] = {str(k): v for k, v in self.allocations.items()}
        data["parallel_free"] = self.parallel_free
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SlotRecord:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["allocations"] = {int(k): int(v) for k, v in
                                (data.get("allocations") or {}).items()}
        return cls(**known)


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """One coordinator as the others see it; refreshed with its heartbeat and on change."""

    host_id: str
    url: str
    version: str
    gpus: tuple[dict[str, Any], ...] = ()
    free_mb: dict[int, int] = field(default_factory=dict)
    ceiling_mb: dict[int, int] = field(default_factory=dict)
    models: tuple[str, ...] = ()  # the models it can serve (available in its catalog)
    slots: tuple[SlotRecord, ...] = ()
    queue_depth: int = 0
    started_at: float = 0.0
    updated_at: float = 0.0
    # model id → the chained prompt-block hashes its replicas here were sent most recently
    # (bounded; see :mod:`model_boss.scheduling.replicas.prefixes`)
    prefixes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def slot(self, key: SlotKey) -> SlotRecord | None:
        """Its slot of the copy ``key``, if it has one."""
        for slot in self.slots:
            if slot.model == key:
                return slot
        return None

    def snapshot(self, now: float) -> Snapshot:
        """The planner's input for this member, as it published it."""
        return Snapshot(dict(self.free_mb), dict(self.ceiling_mb),
                        tuple(s.view() for s in self.slots), now)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host_id": self.host_id, "url": self.url, "version": self.version,
            "gpus": list(self.gpus),
            "free_mb": {str(k): v for k, v in self.free_mb.items()},
            "ceiling_mb": {str(k): v for k, v in self.ceiling_mb.items()},
            "models": list(self.models), "slots": [s.to_dict() for s in self.slots],
            "queue_depth": self.queue_depth, "started_at": self.started_at,
            "updated_at": self.updated_at,
            "prefixes": {model: list(blocks) for model, blocks in self.prefixes.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemberRecord:
        return cls(
            host_id=str(data["host_id"]), url=str(data["url"]),
            version=str(data.get("version", "")),
            gpus=tuple(data.get("gpus") or ()),
            free_mb={int(k): int(v) for k, v in (data.get("free_mb") or {}).items()},
            ceiling_mb={int(k): int(v) for k, v in (data.get("ceiling_mb") or {}).items()},
            models=tuple(data.get("models") or ()),
            slots=tuple(SlotRecord.from_dict(s) for s in data.get("slots") or ()),
            queue_depth=int(data.get("queue_depth", 0)),
            started_at=float(data.get("started_at", 0.0)),
            updated_at=float(data.get("updated_at", 0.0)),
            prefixes={str(model): tuple(int(b) for b in blocks)
                      for model, blocks in (data.get("prefixes") or {}).items()})
