"""Eviction decisions: which idle slots may go, in which order. Pure functions over views."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SlotView:
    """What the evictor needs to know about one slot."""

    model_id: str
    state: str
    pinned: bool
    active: int
    last_used: float
    last_priority: int
    unload_at: float | None
    allocations: dict[int, int]


def evict_candidates(slots: list[SlotView], incoming_priority: int, now: float) -> list[SlotView]:
    """Slots that may be evicted for a request of ``incoming_priority``, best victim first.

    Eligible: READY or OFFLOADED, not pinned, no active request, and either past
    ``unload_at`` or last used at a priority not more important than the incoming one
    (numerically >=). Order: expired first, then least important, then least recently used.
    """

    def expired(s: SlotView) -> bool:
        return s.unload_at is not None and now >= s.unload_at

    eligible = [
        s for s in slots
        if s.state in ("ready", "offloaded") and not s.pinned and s.active == 0
        and (expired(s) or s.last_priority >= incoming_priority)
    ]
    return sorted(eligible, key=lambda s: (not expired(s), -s.last_priority, s.last_used))


def victims_for(
    need_mb: int,
    free_mb: dict[int, int],
    candidates: list[SlotView],
    *,
    allow_split: bool = False,
) -> list[SlotView] | None:
    """The shortest prefix of ``candidates`` whose eviction makes ``need_mb`` fit.

    Returns [] when it already fits, None when evicting every candidate would not be enough.
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
            return chosen
    return None
