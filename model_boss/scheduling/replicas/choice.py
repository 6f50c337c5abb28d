"""The replica decisions, as pure functions over views of one instant.

:func:`route` — which READY replica a request goes to, or that it waits: its session's
replica, else the one that holds most of its prompt's prefix, unless that one's load (requests
running there and waiting for it) is more than ``slack`` beyond the least loaded replica's
(then the least loaded one with room).
:func:`scale_up` — whether a model's waiting requests are worth one more replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from ...slot_key import SlotKey
from ..states import SlotState

T = TypeVar("T")


def prefix_holder(candidates: Sequence[tuple[T, int, int]], slack: int) -> tuple[T, int] | None:
    """The one rule replicas and cluster members are chosen by for a prompt's cache: of
    ``candidates`` (each ``(item, cached blocks, load)``, in the caller's order of preference),
    the one holding most of the prompt's blocks (the first of equals), with its blocks; None
    when none holds any, or when that one's load is more than ``slack`` beyond the least
    loaded candidate's (it would queue behind work an idle one would not)."""
    best: tuple[T, int, int] | None = None
    for candidate in candidates:
        if candidate[1] > (best[1] if best is not None else 0):
            best = candidate
    if best is None:
        return None
    least = min(load for _, _, load in candidates)
    return (best[0], best[1]) if best[2] - least <= slack else None


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One replica of a model as routing reads it."""

    key: SlotKey
    state: str
    active: int
    limit: int  # requests it runs at once
    cached_blocks: int = 0  # leading prompt blocks it was sent before
    order: int = 0  # round-robin position: how many requests were routed before it was last
    waiting: int = 0  # requests already waiting for this replica (their prefix is there)

    @property
    def room(self) -> bool:
        return self.state == SlotState.READY and self.active < self.limit

    @property
    def load(self) -> int:
        return self.active + self.waiting


@dataclass(frozen=True, slots=True)
class Route:
    """Where the request goes (``key``), or None: it waits; and why."""

    key: SlotKey | None
    reason: str
    cached_blocks: int = 0
    waits_for: SlotKey | None = None  # the replica it waits for (its session's or prefix's)


def route(replicas: list[ReplicaView], *, session_replica: SlotKey | None = None,
          slack: int = 2, policy: str = "cache") -> Route:
    """The replica for one request. ``policy``: "cache" (session, prefix, then load),
    "least_loaded", or "round_robin" (the replica routed to longest ago)."""
    ready = [r for r in replicas if r.state == SlotState.READY]
    if not ready:
        return Route(None, "no replica is ready")
    with_room = [r for r in ready if r.room]
    least = min(ready, key=lambda r: r.load)
    if policy == "round_robin":
        return _first(sorted(with_room, key=lambda r: r.order), "round robin")
    if policy == "cache":
        preferred, why = None, ""
        by_session = next((r for r in ready if r.key == session_replica), None)
        if by_session is not None:
            if by_session.load - least.load <= slack:
                preferred, why = by_session, "session"
        else:
            held = prefix_holder([(r, r.cached_blocks, r.load)
                                  for r in sorted(ready, key=lambda r: r.load)], slack)
            if held is not None:
                preferred, why = held[0], "cached prefix"
        if preferred is not None:
            if preferred.room:
                return Route(preferred.key, why, preferred.cached_blocks)
            return Route(None, f"waits for its replica ({why})", preferred.cached_blocks,
                         preferred.key)
    # equally loaded: the one routed to longest ago, so new conversations spread
    ranked = sorted(with_room, key=lambda r: (r.load, -r.cached_blocks, r.order))
    chosen = _first(ranked, "least loaded")
    if chosen.key is not None:
        cached = next(r.cached_blocks for r in ranked if r.key == chosen.key)
        return Route(chosen.key, chosen.reason, cached)
    return chosen


def _first(ranked: list[ReplicaView], reason: str) -> Route:
    if not ranked:
        return Route(None, "every replica is full")
    return Route(ranked[0].key, reason, ranked[0].cached_blocks)


@dataclass(frozen=True, slots=True)
class ScaleView:
    """A model's replicas and waiters at one instant."""

    model_id: str
    replicas: int  # with a worker or on the way (READY, loading, draining)
    loading: int  # of those, loading now
    full: bool  # every READY replica runs its limit
    waiting: int  # requests waiting for the model
    oldest_wait_s: float
    min_replicas: int = 1
    max_replicas: int = 1


def scale_up(view: ScaleView, wait_s: float) -> bool:
    """One more replica now? Below ``min`` with anyone waiting; else, when every replica is
    full and the first waiter has waited ``wait_s``, up to ``max``, one load at a time."""
    if view.waiting == 0 or view.replicas >= view.max_replicas:
        return False
    if view.replicas < view.min_replicas:
        return True
    return view.loading == 0 and view.full and view.oldest_wait_s >= wait_s
