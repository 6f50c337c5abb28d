"""The planner: "does it fit, and what must go?" answered once, as a pure function.

Admission, the router's candidate view and loading all call :func:`plan` over one
:class:`Snapshot` of usage (free VRAM per GPU, what can ever be free, the slots); none of them
recomputes fit with store reads of its own. The answer is one of:

- :class:`Fit` — lease ``placement`` now;
- :class:`Evict` — evict ``victims`` (one at a time, best first), then lease ``placement``;
- :class:`Wait` — it would fit once busy or more important models go idle or expire;
- :class:`Never` — it cannot fit even with every unpinned model gone.

:func:`together` answers the same question for models that must be resident at once (a
realtime pipeline's three).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..gpu.placement import LayerCosts, Placement, place
from ..slot_key import SlotKey, model_of
from .eviction import SlotView, evict_candidates, victims_for
from .states import SlotState


@dataclass(frozen=True, slots=True)
class Demand:
    """What a load needs: the copy it loads (``key``), its size and how it may be placed."""

    key: SlotKey
    need_mb: int
    priority: int
    allow_split: bool = False
    layers: LayerCosts | None = None
    needs_vram: bool = True
    # a replica: not on its siblings' GPUs, and never in place of one of them
    avoid_gpus: frozenset[int] = frozenset()
    siblings: frozenset[SlotKey] = frozenset()

    @property
    def model_id(self) -> str:
        """The model the copy is of."""
        return model_of(self.key)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Usage at one instant. ``free_mb``: effective free VRAM per GPU now; ``ceiling_mb``:
    capacity minus the safety margin per GPU (before pinned models are taken off);
    ``wanted``: the models waiting requests need, in serving order (look-ahead eviction)."""

    free_mb: dict[int, int]
    ceiling_mb: dict[int, int]
    slots: tuple[SlotView, ...] = ()
    now: float = 0.0
    wanted: tuple[str, ...] = ()
    prune: bool = True  # drop victims the others make unnecessary (False: the old prefix rule)


@dataclass(frozen=True, slots=True)
class Fit:
    placement: Placement | None  # None: the backend needs no VRAM (a cloud remote)
    can_start = True


@dataclass(frozen=True, slots=True)
class Evict:
    victims: tuple[SlotKey, ...]  # the copies to evict
    placement: Placement
    can_start = True


@dataclass(frozen=True, slots=True)
class Wait:
    reason: str
    retry_after_s: float = 5.0
    blocking: tuple[SlotKey, ...] = field(default=())  # busy copies, victims once idle
    can_start = False


@dataclass(frozen=True, slots=True)
class Never:
    reason: str
    can_start = False


Plan = Fit | Evict | Wait | Never


def plan(demand: Demand, snapshot: Snapshot) -> Plan:
    """Decide how ``demand`` can be met over ``snapshot``. Pure: no I/O, no clock."""
    if not demand.needs_vram:
        return Fit(None)
    placement = _place(demand, snapshot.free_mb)
    if placement is not None:
        return Fit(placement)
    others = [s for s in snapshot.slots if s.key != demand.key and s.key not in demand.siblings]
    candidates = evict_candidates(others, demand.priority, snapshot.now, snapshot.wanted)
    victims = victims_for(demand.need_mb, _usable(demand, snapshot.free_mb), candidates,
                          allow_split=demand.allow_split, prune=snapshot.prune)
    if victims:
        freed = _usable(demand, snapshot.free_mb)
        for victim in victims:
            for gpu, mb in victim.allocations.items():
                freed[gpu] = freed.get(gpu, 0) + mb
        after = _place(demand, freed)
        if after is not None:
            return Evict(tuple(v.key for v in victims), after)
    pinned: dict[int, int] = {}
    for view in others:
        if view.pinned:
            for gpu, mb in view.allocations.items():
                pinned[gpu] = pinned.get(gpu, 0) + mb
    ceiling = {gpu: max(0, mb - pinned.get(gpu, 0)) for gpu, mb in snapshot.ceiling_mb.items()}
    if _place(demand, ceiling) is None:
        where = ", ".join(f"GPU {i}: {mb} MB" for i, mb in ceiling.items()) or "no GPU"
        return Never(f"'{demand.model_id}' needs {demand.need_mb} MB of VRAM; at most {where} "
                     f"can ever be free for it (capacity minus margin minus pinned models)")
    # only models that would be victims once idle are worth draining; holding back a model
    # this request may not evict (a more important client's, inside its keep-alive) helps none
    busy = tuple(v.key for v in others if v.allocations and not v.pinned
                 and (v.active or v.state not in (SlotState.READY, SlotState.OFFLOADED))
                 and evict_candidates([_settled(v)], demand.priority, snapshot.now))
    return Wait(f"'{demand.model_id}' needs {demand.need_mb} MB; waiting for room",
                blocking=busy)


def _settled(view: SlotView) -> SlotView:
    """``view`` as it will be once its requests and operation end."""
    return replace(view, state=SlotState.READY, active=0)


def _usable(demand: Demand, free_mb: dict[int, int]) -> dict[int, int]:
    """The GPUs ``demand`` may go on (a replica: not its siblings')."""
    return {gpu: mb for gpu, mb in free_mb.items() if gpu not in demand.avoid_gpus}


def _place(demand: Demand, free_mb: dict[int, int]) -> Placement | None:
    free_mb = _usable(demand, free_mb)
    return place(demand.need_mb, free_mb, allow_split=demand.allow_split, partial=demand.layers)


def together(demands: Sequence[Demand], snapshot: Snapshot) -> Never | None:
    """Whether ``demands`` (a realtime pipeline's models) can be resident at once: None when
    they can (now, or by evicting what their priority may evict, or once busy models go
    idle), else :class:`Never` naming the first that cannot fit beside the others, and why.

    Room is the capacity minus the margin, minus what no request at their priority may ever
    take (pinned models; models held by a session at least as important), minus the members
    already holding a lease. The rest are placed largest first, each taking its placement
    out of the room the next one sees. Pure: no I/O, no clock."""
    members = {demand.key for demand in demands}
    priority = min((demand.priority for demand in demands), default=0)
    room = dict(snapshot.ceiling_mb)
    kept: list[str] = []
    for view in snapshot.slots:
        resident = view.key in members and bool(view.allocations)
        untouchable = view.key not in members and (
            view.pinned or (view.held_priority is not None
                            and view.held_priority <= priority))
        if resident or untouchable:
            for gpu, mb in view.allocations.items():
                room[gpu] = max(0, room.get(gpu, 0) - mb)
        if resident:
            kept.append(model_of(view.key))
    loaded = {view.key for view in snapshot.slots if view.allocations}
    placed: list[str] = []
    for demand in sorted(demands, key=lambda d: -d.need_mb):
        if not demand.needs_vram or demand.key in loaded:
            continue
        placement = _place(demand, room)
        if placement is None:
            beside = ", ".join(f"'{name}'" for name in kept + placed) or "nothing else"
            where = ", ".join(f"GPU {i}: {mb} MB" for i, mb in room.items()) or "no GPU"
            return Never(f"'{demand.model_id}' needs {demand.need_mb} MB of VRAM beside "
                         f"{beside}; at most {where} can be free for it at priority "
                         f"{priority} (capacity minus margin, pinned models and models "
                         f"held by sessions at least as important)")
        for gpu, mb in placement.allocations.items():
            room[gpu] = room.get(gpu, 0) - mb
        placed.append(demand.model_id)
    return None
