"""One model's requests replayed over its replicas, to see when the planner adds a copy.

A discrete-event replay of one model: requests (arrival, duration) wait in one FIFO line and
are granted to the least loaded READY copy with room (the coordinator's own
:func:`~.replicas.choice.route`, ``least_loaded``); each copy runs ``parallel`` requests at
once. Whenever a request cannot be granted, the coordinator's own
:func:`~.replicas.choice.scale_up` decides over the view the queue builds (copies READY or
loading, one load at a time, every READY copy full, the first waiter's wait, min and max)
whether one more copy starts; it is READY ``load_s`` later. A copy idle for ``keep_alive_s``
goes, the first one too. Pure and deterministic: no clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..scheduling.replicas import ReplicaView, ScaleView, route, scale_up
from ..scheduling.states import SlotState
from ..slot_key import SlotKey, slot_key
from .simulator import Trace, pct


@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    """A model's replica settings (manifest ``replicas`` and ``parallel``, the daemon's
    ``replica_scale_wait_s``) and its load time."""

    max_replicas: int = 1
    min_replicas: int = 1
    parallel: int = 1  # requests one copy runs at once
    load_s: float = 20.0
    keep_alive_s: float = 300.0
    wait_s: float = 2.0  # the first waiter's wait before one more copy

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas or self.parallel < 1:
            raise ValueError("replicas: 1 <= min <= max, and parallel at least 1")


@dataclass
class ReplicaResult:
    """Waits (arrival to grant, a load included), the copies started (``starts``: when each
    began loading), the seconds copies held a GPU (loading, serving, idle) and the most at
    once."""

    waits: list[float] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    copy_s: float = 0.0
    peak: int = 0

    @property
    def started(self) -> int:
        return len(self.starts)

    def wait_pct(self, q: float) -> float:
        return pct(self.waits, q)


@dataclass
class _Copy:
    key: SlotKey
    started: float
    ready_at: float
    ends: list[float] = field(default_factory=list)  # of the requests it runs
    idle_since: float = 0.0
    order: int = 0  # routed requests when it was last routed to

    def ready(self, t: float) -> bool:
        return self.ready_at <= t


def requests_of(trace: Trace, model: str) -> list[tuple[float, float]]:
    """``model``'s requests in ``trace`` as (arrival, duration)."""
    return [(r.arrival, r.duration) for r in trace.requests if r.model == model]


def busiest_model(trace: Trace) -> str:
    """The model with the most requests (the first by name among equals)."""
    counts: dict[str, int] = {}
    for r in trace.requests:
        counts[r.model] = counts.get(r.model, 0) + 1
    return min(counts, key=lambda m: (-counts[m], m))


def simulate_replicas(requests: Iterable[tuple[float, float]],
                      settings: ReplicaSettings, model: str = "model") -> ReplicaResult:
    """Replay ``requests`` (arrival, duration) under ``settings``; each is served once."""
    return _Run(sorted(requests), settings, model).run()


class _Run:
    def __init__(self, requests: list[tuple[float, float]], settings: ReplicaSettings,
                 model: str) -> None:
        self.requests = requests
        self.s = settings
        self.model = model
        self.copies: list[_Copy] = []
        self.waiting: deque[tuple[float, float]] = deque()
        self.routed = 0
        self.named = 0
        self.result = ReplicaResult()

    def run(self) -> ReplicaResult:
        t, arrived = 0.0, 0
        while arrived < len(self.requests) or self.waiting or self.copies:
            while arrived < len(self.requests) and self.requests[arrived][0] <= t:
                self.waiting.append(self.requests[arrived])
                arrived += 1
            for copy in self.copies:
                done = [e for e in copy.ends if e <= t]
                if done:
                    copy.ends = [e for e in copy.ends if e > t]
                    if not copy.ends:
                        copy.idle_since = max(done)
            self.grant(t)
            self.expire(t)
            self.scale(t)
            nxt = self.next_event(t, arrived)
            if nxt is None:  # an endless keep-alive: the copies held until the last event
                self.result.copy_s += sum(t - c.started for c in self.copies)
                break
            t = nxt
        return self.result

    def grant(self, t: float) -> None:
        """FIFO: the first waiter to the least loaded READY copy with room, while one has."""
        while self.waiting:
            views = [ReplicaView(c.key, SlotState.READY if c.ready(t) else SlotState.LOADING,
                                 len(c.ends), self.s.parallel, order=c.order)
                     for c in self.copies]
            chosen = route(views, policy="least_loaded")
            if chosen.key is None:
                return
            arrival, duration = self.waiting.popleft()
            copy = next(c for c in self.copies if c.key == chosen.key)
            copy.ends.append(t + duration)
            self.routed += 1
            copy.order = self.routed
            self.result.waits.append(t - arrival)

    def expire(self, t: float) -> None:
        """Idle copies past their keep-alive go; the seconds they held count."""
        for copy in list(self.copies):
            gone = self.gone_at(copy)
            if gone is not None and gone <= t:
                self.result.copy_s += gone - copy.started
                self.copies.remove(copy)

    def gone_at(self, copy: _Copy) -> float | None:
        """When an idle copy goes (a loading one counts as idle from its load's end)."""
        return None if copy.ends else copy.idle_since + self.s.keep_alive_s

    def scale(self, t: float) -> None:
        """One more copy (more below ``min``) while :func:`scale_up` says so."""
        while self.waiting:
            ready = [c for c in self.copies if c.ready(t)]
            view = ScaleView(
                self.model, replicas=len(self.copies),
                loading=len(self.copies) - len(ready),
                full=bool(ready) and all(len(c.ends) >= self.s.parallel for c in ready),
                waiting=len(self.waiting),
                oldest_wait_s=round(t - self.waiting[0][0], 9),
                min_replicas=self.s.min_replicas, max_replicas=self.s.max_replicas)
            if not scale_up(view, self.s.wait_s):
                return
            self.named += 1
            self.copies.append(_Copy(slot_key(self.model, self.named), t, t + self.s.load_s,
                                     idle_since=t + self.s.load_s))
            self.result.starts.append(t)
            self.result.peak = max(self.result.peak, len(self.copies))

    def next_event(self, t: float, arrived: int) -> float | None:
        """The next arrival, load done, request done, keep-alive end or scale time."""
        times = [e for c in self.copies for e in c.ends]
        times += [c.ready_at for c in self.copies]
        times += [g for g in map(self.gone_at, self.copies) if g is not None]
        if arrived < len(self.requests):
            times.append(self.requests[arrived][0])
        if self.waiting:
            times.append(self.waiting[0][0] + self.s.wait_s)
        later = [x for x in times if x > t]
        return min(later) if later else None
