"""Which member serves a request: a pure function over the members' published records.

Order of preference:

1. a member where the model is READY: the one whose published prompt blocks match most of
   the request's prefix, unless its load on the model (queued and running) is more than
   ``slack`` beyond the least loaded READY member's; else (or with no match) one with a
   parallel slot free first, then the shortest queue, this member on a tie;
2. a member where it is on its way (LOADING, or parked in CPU RAM: OFFLOADED), so a second
   copy is not loaded beside it;
3. nowhere: each member's own :func:`~model_boss.scheduling.planner.plan` over its published
   snapshot; fits without eviction first, then the cheapest eviction (fewest MB evicted),
   then waiting for room; within each, the shortest queue, then this member, then the host
   id (so every member, given the same records, names the same one).

Before these, one more copy (:func:`scale_out`): when the model is READY on some members
but every READY copy is busy to its parallel limit, its longest waiter there has waited
``wait_s``, and fewer copies run or are on their way than its manifest's ``replicas.max``,
the request goes cold to the cheapest member that holds no copy of it and has room now
(rule 3 over those members, fitting or evicting only): that member loads it and serves.

Members that do not serve the model (not in their catalog, or unavailable there), or where
it can never fit, are never chosen. When no member can take it, this member answers (its own
error says why).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from ..scheduling.planner import Demand, Evict, Fit, Never, Wait, plan
from ..scheduling.replicas.choice import prefix_holder
from ..slot_key import SlotKey, model_of
from .records import MemberRecord, SlotRecord

ON_THE_WAY = ("loading", "offloaded", "offloading", "draining")


@dataclass(frozen=True, slots=True)
class Here:
    """Serve on this member; ``cold``: the model is nowhere yet (this member loads it)."""

    reason: str
    cold: bool = False


@dataclass(frozen=True, slots=True)
class There:
    """Forward to ``member``; ``cold``: the model is nowhere yet (``member`` loads it)."""

    member: MemberRecord
    reason: str
    cold: bool = False


Choice = Here | There


def choose_member(demand: Demand, members: Sequence[MemberRecord], local_id: str,
                  now: float, prefix: tuple[int, ...] = (), slack: int = 2,
                  replicas_max: int = 1, wait_s: float = 2.0) -> Choice:
    """Pick the member for ``demand``. Pure: no I/O, no clock (``now`` is given)."""
    return (scale_out(demand, members, local_id, now, replicas_max, wait_s)
            or where_warm(demand.model_id, members, local_id, prefix, slack)
            or where_cold(demand, members, local_id, now))


def copy_wanted(model: str, members: Sequence[MemberRecord], now: float,
                replicas_max: int = 1, wait_s: float = 2.0) -> bool:
    """Whether ``model`` is worth one more copy on another member: READY somewhere, every
    READY copy busy to its parallel limit, its longest waiter where it is READY waiting
    ``wait_s`` by ``now`` (as published, plus the record's age), none loading (one load at a
    time), and fewer copies READY or on their way than ``replicas_max``."""
    if replicas_max <= 1:
        return False
    copies = [(m, s) for m in members for s in m.slots
              if _copy_of(s.model, model) and (s.state == "ready" or s.state in ON_THE_WAY)]
    ready = [(m, s) for m, s in copies if s.state == "ready"]
    if not ready or len(copies) >= replicas_max or any(s.parallel_free for _, s in ready) \
            or any(s.state == "loading" for _, s in copies):
        return False
    waits = [s.oldest_wait_s + max(0.0, now - m.updated_at)
             for m, s in ready if s.queued or s.oldest_wait_s]
    return bool(waits) and max(waits) >= wait_s


def scale_out(demand: Demand, members: Sequence[MemberRecord], local_id: str, now: float,
              replicas_max: int = 1, wait_s: float = 2.0) -> Choice | None:
    """The member that loads one more copy of the model (cold), when :func:`copy_wanted`
    says one is worth it: the cheapest of those holding none that can take it now (fit, or
    evict what the planner lets the request evict); None: the other rules decide."""
    model = demand.model_id
    if not copy_wanted(model, members, now, replicas_max, wait_s):
        return None
    others = [m for m in members if not any(_copy_of(s.model, model) for s in m.slots)]
    costed = [row for row in _costed(demand, others, local_id, now) if row[0][0] <= 1]
    if not costed:
        return None
    best = min(costed, key=lambda row: row[:4])
    return _pick(best[4], local_id, f"every copy of '{model}' is busy and its requests "
                                    f"wait; {best[4].host_id} {_COST_WORDS[best[0][0]]}",
                 cold=True)


def _copy_of(key: SlotKey, model: str) -> bool:
    """Whether slot ``key`` is ``model`` or one of its replicas on one member."""
    return model_of(key) == model


def where_warm(model: str, members: Sequence[MemberRecord], local_id: str,
               prefix: tuple[int, ...] = (), slack: int = 2) -> Choice | None:
    """Rules 1 and 2: where ``model`` is READY, else on its way; None when it is nowhere.
    Needs no estimate of the model, so a warm request costs no more than this. ``prefix``:
    the request's chained prompt-block hashes (empty: no preference by cache)."""
    serving = [m for m in members if model in m.models]
    ready = [(m, s) for m in serving if (s := _best_copy(m, model, ("ready",))) is not None]
    if ready:
        ranked = sorted(ready, key=lambda pair: (
            pair[1].parallel_free == 0, pair[1].queued, pair[1].active,
            pair[0].host_id != local_id, pair[0].host_id))
        held = _holder(model, ranked, prefix, slack)
        if held is not None:
            member, cached = held
            return _pick(member, local_id, f"'{model}' is ready on {member.host_id}, "
                                           f"{cached} prompt blocks cached there")
        member = ranked[0][0]
        return _pick(member, local_id, f"'{model}' is ready on {member.host_id}")
    coming = [(m, s) for m in serving if (s := _best_copy(m, model, ON_THE_WAY)) is not None]
    if coming:
        member, copy = min(coming, key=lambda pair: (pair[0].host_id != local_id,
                                                     pair[0].host_id))
        return _pick(member, local_id, f"'{model}' is {copy.state} on {member.host_id}")
    return None


def _best_copy(member: MemberRecord, model: str,
               states: Sequence[str]) -> SlotRecord | None:
    """Of ``member``'s copies of ``model`` in one of ``states``, the one a request is best
    sent to: one with a free parallel slot first, then the least busy, then the first copy."""
    copies = [s for s in member.slots if _copy_of(s.model, model) and s.state in states]
    return min(copies, key=lambda s: (s.parallel_free == 0, s.active, s.model != model),
               default=None)


def matched(held: Collection[int], prefix: tuple[int, ...]) -> int:
    """How many leading blocks of ``prefix`` are in ``held`` (each hash stands for every
    block before it, so the last one found counts for all of them)."""
    found = set(held)
    for n in range(len(prefix), 0, -1):
        if prefix[n - 1] in found:
            return n
    return 0


def _holder(model: str, ranked: list[tuple[MemberRecord, SlotRecord]],
            prefix: tuple[int, ...], slack: int) -> tuple[MemberRecord, int] | None:
    """The READY member that holds most of ``prefix`` and is not more than ``slack``
    requests busier than the least loaded, with how many blocks it holds; None: no such."""
    if not prefix:
        return None
    # in the load order: the first of equal matches wins
    return prefix_holder([(member, matched(member.prefixes.get(model, ()), prefix),
                           slot.queued + slot.active) for member, slot in ranked], slack)


def where_cold(demand: Demand, members: Sequence[MemberRecord], local_id: str,
               now: float) -> Choice:
    """Rule 3: the member whose own plan for loading ``demand`` is cheapest."""
    model = demand.model_id
    costed = _costed(demand, members, local_id, now)
    if not costed:
        return Here(f"no member can take '{model}'")
    best = min(costed, key=lambda row: row[:4])
    return _pick(best[4], local_id, f"'{model}' is nowhere; {best[4].host_id} "
                                    f"{_COST_WORDS[best[0][0]]}", cold=True)


def _costed(demand: Demand, members: Sequence[MemberRecord], local_id: str,
            now: float) -> list[tuple[tuple[int, int], int, bool, str, MemberRecord]]:
    """Per member that serves the model and could ever load it: its cost, then the keys
    that break ties (shortest queue, this member, the host id), then the member."""
    costed = []
    for member in members:
        if demand.model_id not in member.models:
            continue
        cost = _cost(demand, member, now)
        if cost is not None:
            costed.append((cost, member.queue_depth, member.host_id != local_id,
                           member.host_id, member))
    return costed


_COST_WORDS = {0: "has room for it", 1: "can make room for it", 2: "will have room for it"}


def _cost(demand: Demand, member: MemberRecord, now: float) -> tuple[int, int] | None:
    """(rank, evicted MB) of loading on ``member``; None when it never can."""
    answer = plan(demand, member.snapshot(now))
    if isinstance(answer, Fit):
        return (0, 0)
    if isinstance(answer, Evict):
        victims = [member.slot(v) for v in answer.victims]
        return (1, sum(sum(s.allocations.values()) for s in victims if s is not None))
    if isinstance(answer, Wait):
        return (2, 0)
    assert isinstance(answer, Never)
    return None


def _pick(member: MemberRecord, local_id: str, reason: str, cold: bool = False) -> Choice:
    return Here(reason, cold) if member.host_id == local_id else There(member, reason, cold)

