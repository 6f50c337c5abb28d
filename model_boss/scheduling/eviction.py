"""Eviction decisions: which idle slots may go, in which order. Pure functions over views.

Look-ahead and cost: a model that a waiting request needs is the last choice, every copy of it
(the request may go to any; the one needed latest goes first among those), and among the rest
the cheapest to lose goes first: its reload cost (seconds to bring it back: the CPU tier's
onload, else the learned cold load) times its recent request rate. Without those figures the
order is least important, then least recently used.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..slot_key import SlotKey, model_of
from .states import SlotState


@dataclass(frozen=True, slots=True)
class SlotView:
    """What the evictor needs to know about one slot (one copy of a model: ``key``)."""

    key: SlotKey
    state: str
    pinned: bool
    active: int
    last_used: float
    last_priority: int
    unload_at: float | None
    allocations: dict[int, int]
    reload_s: float = 0.0      # seconds to bring it back once evicted (CPU tier or disk)
    rate_per_s: float = 0.0    # recent requests per second (decayed)
    held_priority: int | None = None  # an open session's priority keeping it warm

    @property
    def keep_value(self) -> float:
        """Expected reload seconds per second that evicting it would cost."""
        return self.reload_s * self.rate_per_s


def evict_candidates(slots: list[SlotView], incoming_priority: int, now: float,
                     wanted: Sequence[str] = ()) -> list[SlotView]:
    """Slots that may be evicted for a request of ``incoming_priority``, best victim first.

    Eligible: READY or OFFLOADED, not pinned, no active request, and either past
    ``unload_at`` or last used at a priority not more important than the incoming one
    (numerically >=; the incoming priority is the aged one), and, while an open session
    holds it, only for a request more important than the session (numerically <). Order:
    models no waiting request needs before those in ``wanted`` (the waiting requests' models
    in serving order; of those, the one needed latest first; every copy of a wanted model is
    wanted, since a waiting request may go to any of them, and a copy being loaded never
    evicts its siblings: the planner leaves them out), then expired first, then least
    important, then the lowest keep value (reload cost × request rate), then least recently
    used.
    """
    position = {model: i for i, model in reversed(list(enumerate(wanted)))}

    def needed(s: SlotView) -> tuple[int, int]:
        model = model_of(s.key)
        return (0, 0) if model not in position else (1, -position[model])

    def expired(s: SlotView) -> bool:
        return s.unload_at is not None and now >= s.unload_at

    eligible = [
        s for s in slots
        if s.state in (SlotState.READY, SlotState.OFFLOADED) and not s.pinned and s.active == 0
        and (expired(s) or s.last_priority >= incoming_priority)
        and (s.held_priority is None or incoming_priority < s.held_priority)
    ]
    return sorted(eligible, key=lambda s: (
        needed(s), not expired(s), -s.last_priority, s.keep_value, s.last_used))


def victims_for(
    need_mb: int,
    free_mb: dict[int, int],
    candidates: list[SlotView],
    *,
    allow_split: bool = False,
    prune: bool = True,
) -> list[SlotView] | None:
    """The shortest prefix of ``candidates`` whose eviction makes ``need_mb`` fit, less any
    victim (most valuable first) that the rest make unnecessary: one big idle model goes
    instead of three small ones ahead of it.

    Returns [] when it already fits, None when evicting every candidate would not be enough.
    ``prune=False`` keeps the whole prefix (the policy before pruning, a benchmark baseline).
    """
    freed = dict(free_mb)

    def fits() -> bool:
        if max(freed.values(), default=0) >= need_mb:
            return True
        return allow_split and sum(v for v in freed.values() if v > 0) >= need_mb

    if fits():
        return []
    chosen: list[SlotView] = []
    for victim in candidates:
        if not victim.allocations:
            continue  # an offloaded slot holds no VRAM: evicting it frees nothing here
        chosen.append(victim)
        for gpu, mb in victim.allocations.items():
            freed[gpu] = freed.get(gpu, 0) + mb
        if fits():
            return _prune(chosen, freed, fits) if prune else chosen
    return None


def _prune(chosen: list[SlotView], freed: dict[int, int],
           fits: Callable[[], bool]) -> list[SlotView]:
    """Drop the victims, most valuable first, that the others make unnecessary."""
    for victim in reversed(list(chosen)):
        for gpu, mb in victim.allocations.items():
            freed[gpu] -= mb
        if fits():
            chosen.remove(victim)
        else:
            for gpu, mb in victim.allocations.items():
                freed[gpu] += mb
    return chosen
