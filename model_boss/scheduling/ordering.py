"""Serving order: which waiting request goes next. Pure functions over plain views, and
:class:`Lines`, the same order kept as requests come and go (so a long queue is not sorted on
every pass).

One ordering serves the coordinator's queue, its status listing and the trace simulator, so
what an operator replays is what the daemon does.

With aging on (``aging_s > 0``) every request gets a *due time*::

    due = submitted_at + aging_s * priority + turn_s * rank / share - warm_credit_s

and the earliest due time is served first. Priority sets how far in the future a request is
due, so a request of priority ``p`` overtakes any request of priority 0 that arrives more than
``p * aging_s`` seconds after it: nothing starves. ``rank`` is how many requests of the same
client and priority were waiting when this one arrived, divided by the client's ``share``
(fair share: a client's burst of 12 puts its own 12th request 11 turns of ``turn_s`` back, not
another client's single request). Under a key, whose requests are one client, ``rank`` is
dealt again among the key's end users (:func:`dealt_ranks`): fair share in two levels,
between keys and then between one key's end users. ``warm_credit_s`` is the reload time
saved by serving a model that is already loaded, so queued requests for a loaded model run
as one group before a swap
(bounded: a cold request still overtakes once it has waited that long).

With aging off the order is strict: ``(priority, rank / share, cold, submitted_at)``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sortedcontainers import SortedList


@dataclass(frozen=True, slots=True)
class Waiter:
    """What ordering needs to know about one waiting request."""

    model_id: str
    priority: int
    client_id: str
    submitted_at: float
    rank: float = 0.0  # from rank_on_arrival


@dataclass(frozen=True, slots=True)
class OrderPolicy:
    """``aging_s``: seconds of waiting that count as one priority level (0: strict priority).
    ``fair_share``: interleave clients of equal priority by their weighted share; each request
    a client already has waiting ahead puts the next ``turn_s`` seconds later."""

    aging_s: float = 2.0
    fair_share: bool = True
    turn_s: float = 2.0


STRICT = OrderPolicy(aging_s=0.0, fair_share=False)


def rank_on_arrival(waiting: Iterable[Waiter], client_id: str, priority: int,
                    share: float = 1.0) -> float:
    """A new request's fair-share rank: how many requests of the same client and priority
    already wait, over the client's share. Fixed at arrival, so the requests of a burst keep
    their places as earlier ones are served, and a client's offset never exceeds its own
    backlog (bounded by its queue limit)."""
    ahead = sum(1 for w in waiting if w.client_id == client_id and w.priority == priority)
    return fair_rank(ahead, share)


def fair_rank(ahead: int, share: float = 1.0) -> float:
    """The rank of a request with ``ahead`` of its client's requests of its priority already
    waiting (the queue keeps that count as requests come and go)."""
    return ahead / max(share, 1e-6)


def end_user_turns(end_users: Sequence[str]) -> list[int]:
    """For a key's waiting requests in arrival order, named by their end users: each one's
    turn among its own end user's (0 for the first, 1 for the next, ...)."""
    seen: Counter[str] = Counter()
    turns = []
    for end_user in end_users:
        turns.append(seen[end_user])
        seen[end_user] += 1
    return turns


def dealt_ranks(end_users: Sequence[str], ranks: Sequence[float]) -> list[float]:
    """Fair share within a key: its waiting requests of one priority, in arrival order (the
    end user of each, and the rank each holds among the keys), given the same ranks again,
    lowest first, round-robin among its end users: every end user's first request in
    arrival order, then every one's second, and so on. The key keeps the ranks it held, so
    its place among keys is as before; within it, one end user's burst no longer holds
    another's first request behind it, and each end user's own requests keep their order."""
    turns = end_user_turns(end_users)
    dealt = [0.0] * len(ranks)
    for rank, at in zip(sorted(ranks), sorted(range(len(turns)), key=lambda i: (turns[i], i)),
                        strict=True):
        dealt[at] = rank
    return dealt


def order_key(waiter: Waiter, *, warm_credit_s: float, policy: OrderPolicy,
              ) -> tuple[float, ...]:
    """The sort key of one waiter (smaller goes first); ``warm_credit_s`` > 0 when its model
    is loaded."""
    rank = waiter.rank if policy.fair_share else 0.0
    if policy.aging_s <= 0:
        return (waiter.priority, rank, 0.0 if warm_credit_s > 0 else 1.0, waiter.submitted_at)
    due = (waiter.submitted_at + policy.aging_s * waiter.priority + policy.turn_s * rank
           - warm_credit_s)
    return (due, waiter.submitted_at)


def serving_order(waiters: Iterable[Waiter], warm_credit_s: Mapping[str, float],
                  policy: OrderPolicy) -> list[Waiter]:
    """``waiters`` in the order they are served. ``warm_credit_s``: model id → the reload
    seconds saved by serving it now (present only for loaded models)."""
    return sorted(waiters, key=lambda w: order_key(
        w, warm_credit_s=warm_credit_s.get(w.model_id, 0.0), policy=policy))


def effective_priority(priority: int, waited_s: float, policy: OrderPolicy) -> int:
    """The priority a request has earned by waiting: one level more important per
    ``aging_s`` waited (it may go below 0). Eviction uses it, so a request that has waited
    long enough may evict an idle model last used by a more important client."""
    if policy.aging_s <= 0:
        return priority
    return priority - math.floor(max(0.0, waited_s) / policy.aging_s)


def wait_bound_s(priority: int, *, most_important: int, aging_s: float, warm_credit_s: float,
                 drain_s: float, load_s: float) -> float:
    """The longest a request of ``priority`` waits behind endless traffic of
    ``most_important`` priority for another, loaded model, while its own model fits the
    hardware: the aging that makes it first (plus the loaded model's warm credit), the
    requests already running on the model it displaces, and its own load
    (docs/SCHEDULING.md)."""
    return max(0, priority - most_important) * aging_s + warm_credit_s + drain_s + load_s


# --- the order kept incrementally -------------------------------------------------------
# Lines: the waiting requests kept in serving order without sorting the queue on every pass.
#
# :func:`~.ordering.order_key` orders every waiter; the only part of it that changes while a
# request waits is its model's warm credit, and that moves all of a model's requests alike. So
# each model's requests are kept in a line sorted once, on arrival (``order_key`` with no
# credit, then arrival), and the serving order is the lines merged by their heads' keys *with*
# their models' credits: the same order :func:`~.ordering.serving_order` gives (ties by arrival,
# as its stable sort keeps them). A pass of the queue walks that merge lazily and drops a model
# from the walk once nothing more of it can be served, so a pass costs what it serves and one
# step per model, not a sort of everything waiting.

# a waiting request (anything with .waiter and .model_id) in its line: (key, arrival, it)
Entry = tuple[tuple[float, ...], int, Any]


class Lines:
    """The waiting requests, each model's in a line sorted once on arrival: see the module's
    last part."""

    def __init__(self, policy: OrderPolicy) -> None:
        self.policy = policy
        self._lines: dict[str, SortedList] = {}  # O(log n) to add, remove and find
        self._entries: dict[Any, Entry] = {}
        self._arrivals = itertools.count()

    def add(self, request: Any) -> None:
        key = order_key(request.waiter, warm_credit_s=0.0, policy=self.policy)
        entry: Entry = (key, next(self._arrivals), request)
        self._entries[request] = entry
        line = self._lines.get(request.model_id)
        if line is None:
            line = self._lines[request.model_id] = SortedList()
        line.add(entry)

    def discard(self, request: Any) -> None:
        entry = self._entries.pop(request, None)
        if entry is None:
            return
        line = self._lines[request.model_id]
        line.discard(entry)
        if not line:
            del self._lines[request.model_id]

    def walk(self, credits: Mapping[str, float]) -> Walk:
        return Walk(self, credits)

    def head(self, credits: Mapping[str, float]) -> Any | None:
        """The first waiter in serving order (a walk's first, without the walk)."""
        if len(self._lines) == 1:
            (line,) = self._lines.values()
            return line[0][2]
        heads = [(self._merge_key(line[0], model, credits), line[0][2])
                 for model, line in self._lines.items()]
        return min(heads, key=lambda head: head[0])[1] if heads else None

    def models(self, credits: Mapping[str, float]) -> list[str]:
        """The models with waiters, in the order of their first waiter."""
        heads = sorted((self._merge_key(line[0], model, credits), model)
                       for model, line in self._lines.items())
        return [model for _, model in heads]

    def _merge_key(self, entry: Entry, model: str,
                   credits: Mapping[str, float]) -> tuple[Any, ...]:
        waiter = entry[2].waiter
        return (order_key(waiter, warm_credit_s=credits.get(model, 0.0), policy=self.policy),
                entry[1])

    def _after(self, model: str, entry: Entry) -> Entry | None:
        """The entry after ``entry`` in its model's line as the line is now (it may have
        changed since ``entry`` was read)."""
        line = self._lines.get(model)
        if not line:
            return None
        at = line.bisect_right(entry)
        return line[at] if at < len(line) else None


class Walk:
    """One pass over the lines in serving order; :meth:`drop` ends a model's part of it."""

    def __init__(self, lines: Lines, credits: Mapping[str, float]) -> None:
        self._lines = lines
        self._credits = credits
        self._dropped: set[str] = set()
        self._heap = [(lines._merge_key(line[0], model, credits), model, line[0])
                      for model, line in lines._lines.items()]
        heapq.heapify(self._heap)

    def __iter__(self) -> Iterator[Any]:
        while self._heap:
            _, model, entry = heapq.heappop(self._heap)
            if model in self._dropped:
                continue
            following = self._lines._after(model, entry)
            if following is not None:
                heapq.heappush(self._heap, (self._lines._merge_key(following, model,
                                                                   self._credits),
                                            model, following))
            yield entry[2]

    def drop(self, model: str) -> None:
        self._dropped.add(model)
