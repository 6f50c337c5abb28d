"""Trace simulator: replay requests through the coordinator's own ordering and planner.

A discrete-event simulation of one GPU serving one request at a time, with simulated load
and inference times. The planner policies call :func:`~.ordering.serving_order` and
:func:`~.planner.plan` exactly as the queue does, with the queue's dispatch rule: requests
are taken in serving order; one whose model must wait for room holds back further grants on
the models it waits for. Baselines:

- ``today``: strict priority order, eviction by priority and recency (no look-ahead, no
  pruning of the victim prefix): the policy before aging and look-ahead;
- ``model-boss``: aging, fair share, warm grouping, look-ahead and cost-aware eviction;
- ``one-at-a-time`` (FIFO; when a model does not fit, everything else goes), ``lru`` (FIFO,
  least recently used);
- ``belady``: FIFO order, evict the model whose next use is farthest away (the offline
  optimum for cold loads under FIFO order).

``known-rates`` (:data:`KNOWN_RATES`, a reference, not a baseline) is ``model-boss`` told each
model's true request rate over the whole trace instead of the learned recent one: the best a
rate-based prediction can do, which bounds what better rate estimates could still gain.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from ..scheduling.eviction import SlotView
from ..scheduling.ordering import (
    STRICT,
    OrderPolicy,
    Waiter,
    effective_priority,
    rank_on_arrival,
    serving_order,
)
from ..scheduling.planner import Demand, Evict, Fit, Snapshot, plan
from ..scheduling.rates import RequestRates
from ..slot_key import model_of, slot_key

LOAD_S_PER_GB = 1.5  # simulated cold load: a fixed second plus size-proportional reading
STAY_WARM_S = 300.0


def load_s(size_mb: int) -> float:
    return 1.0 + LOAD_S_PER_GB * size_mb / 1024


@dataclass(slots=True)
class SimRequest:
    arrival: float
    model: str
    priority: int
    duration: float
    client: str = "anonymous"


@dataclass
class Trace:
    name: str
    requests: list[SimRequest]
    sizes: dict[str, int]  # MB
    capacity_mb: int
    load_s: dict[str, float] = field(default_factory=dict)  # measured; else from the size

    def load_time(self, model: str) -> float:
        return self.load_s.get(model) or load_s(self.sizes[model])


@dataclass(frozen=True)
class SimPolicy:
    """How a simulated scheduler orders requests and picks victims. ``order`` None: FIFO."""

    name: str
    order: OrderPolicy | None = None
    evictor: str = "planner"  # planner | lru | belady | one-at-a-time
    look_ahead: bool = False
    stay_warm_s: float = STAY_WARM_S
    known_rates: bool = False  # each model's rate over the whole trace (a reference bound)


TODAY = SimPolicy("today", STRICT)
MODEL_BOSS = SimPolicy("model-boss", OrderPolicy(), look_ahead=True)
BASELINES = [SimPolicy("one-at-a-time", evictor="one-at-a-time"),
             SimPolicy("lru", evictor="lru"), SimPolicy("belady", evictor="belady")]
POLICIES = [TODAY, MODEL_BOSS, *BASELINES]
KNOWN_RATES = SimPolicy("known-rates", OrderPolicy(), look_ahead=True, known_rates=True)


@dataclass
class Result:
    cold_loads: int = 0
    load_s: float = 0.0  # seconds spent in cold loads
    inversions: int = 0
    peak_mb: int = 0
    waits: dict[int, list[float]] = field(default_factory=dict)

    def wait_pct(self, priority: int, q: float) -> float:
        return pct(self.waits.get(priority, []), q)


@dataclass
class _Resident:
    last_used: float
    last_priority: int


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def simulate(trace: Trace, policy: SimPolicy) -> Result:
    """Replay ``trace`` under ``policy``; every request is served exactly once."""
    return _Run(trace, policy).run()


class _Run:
    def __init__(self, trace: Trace, policy: SimPolicy) -> None:
        self.trace = trace
        self.policy = policy
        self.requests = sorted(trace.requests, key=lambda r: r.arrival)
        self.future: dict[str, list[float]] = {}
        for r in self.requests:
            self.future.setdefault(r.model, []).append(r.arrival)
        self.resident: dict[str, _Resident] = {}
        self.rates: RequestRates | _KnownRates = (
            _KnownRates(self.requests) if policy.known_rates else RequestRates())
        self.result = Result()

    def used(self) -> int:
        return sum(self.trace.sizes[m] for m in self.resident)

    def run(self) -> Result:
        t, arrived, waiting = 0.0, 0, []
        waiters: dict[int, Waiter] = {}
        while arrived < len(self.requests) or waiting:
            while arrived < len(self.requests) and self.requests[arrived].arrival <= t:
                req = self.requests[arrived]
                rank = rank_on_arrival((waiters[id(r)] for r in waiting), req.client,
                                       req.priority)
                waiting.append(req)
                waiters[id(req)] = Waiter(req.model, req.priority, req.client, req.arrival,
                                          rank)
                arrived += 1
            if not waiting:
                t = self.requests[arrived].arrival
                continue
            chosen = self.choose(waiting, waiters, t)
            if chosen is None:  # wait for a keep-alive to end, an arrival, or aging
                nxt = [r.last_used + self.policy.stay_warm_s for r in self.resident.values()]
                if arrived < len(self.requests):
                    nxt.append(self.requests[arrived].arrival)
                if self.policy.order is not None and self.policy.order.aging_s > 0:
                    nxt.append(t + self.policy.order.aging_s)
                t = max(t + 1e-6, min([n for n in nxt if n > t], default=t + 1.0))
                continue
            self.count_inversion(chosen, waiting)
            waiting.remove(chosen)
            if chosen.model not in self.resident:
                self.result.cold_loads += 1
                self.result.load_s += self.trace.load_time(chosen.model)
                t += self.trace.load_time(chosen.model)
                self.resident[chosen.model] = _Resident(t, chosen.priority)
            self.result.peak_mb = max(self.result.peak_mb, self.used())
            self.result.waits.setdefault(chosen.priority, []).append(t - chosen.arrival)
            self.rates.record(chosen.model, t)
            t += chosen.duration
            self.resident[chosen.model] = _Resident(t, chosen.priority)
        return self.result

    # -- one decision ---------------------------------------------------------------------

    def choose(self, waiting: list[SimRequest], waiters: dict[int, Waiter],
               t: float) -> SimRequest | None:
        if self.policy.evictor != "planner":
            req = min(waiting, key=lambda r: r.arrival)
            self.make_room_baseline(req, t)
            return req
        order = self.policy.order or STRICT
        ordered, wanted = in_serving_order(self.trace, waiting, waiters, self.resident, order)
        draining: set[str] = set()
        considered: set[str] = set()
        for req in ordered:
            if req.model in self.resident:
                if req.model not in draining:
                    return req
                continue
            if req.model in considered:
                continue
            considered.add(req.model)
            decision = plan(demand_of(self.trace, req, t, order), self.snapshot(t, wanted))
            if isinstance(decision, Fit):
                return req
            if isinstance(decision, Evict):
                for victim in decision.victims:
                    del self.resident[model_of(victim)]
                return req
            draining.update(map(model_of, getattr(decision, "blocking", ())))
        return None

    def snapshot(self, t: float, wanted: tuple[str, ...]) -> Snapshot:
        capacity = self.trace.capacity_mb
        ahead = self.policy.look_ahead
        views = tuple(
            SlotView(slot_key(m), "ready", False, 0, r.last_used, r.last_priority,
                     r.last_used + self.policy.stay_warm_s, {0: self.trace.sizes[m]},
                     reload_s=self.trace.load_time(m) if ahead else 0.0,
                     rate_per_s=self.rates.rate(m, t) if ahead else 0.0)
            for m, r in self.resident.items())
        return Snapshot({0: capacity - self.used()}, {0: capacity}, views, t,
                        wanted if ahead else (), prune=ahead)

    def make_room_baseline(self, req: SimRequest, t: float) -> None:
        if req.model in self.resident:
            return
        if self.policy.evictor == "one-at-a-time":
            if self.trace.capacity_mb - self.used() < self.trace.sizes[req.model]:
                self.resident.clear()
            return
        while self.trace.capacity_mb - self.used() < self.trace.sizes[req.model]:
            if self.policy.evictor == "lru":
                victim = min(self.resident, key=lambda m: self.resident[m].last_used)
            else:  # belady
                victim = max(self.resident, key=lambda m: self.next_use(m, t))
            del self.resident[victim]

    def next_use(self, model: str, now: float) -> float:
        return next((a for a in self.future[model] if a >= now), math.inf)

    def count_inversion(self, chosen: SimRequest, waiting: list[SimRequest]) -> None:
        """A more important waiter that arrived no later was passed over."""
        if any(o is not chosen and o.priority < chosen.priority and o.arrival <= chosen.arrival
               for o in waiting):
            self.result.inversions += 1


def in_serving_order(trace: Trace, waiting: list[SimRequest], waiters: dict[int, Waiter],
                     loaded: Iterable[str], order: OrderPolicy,
                     ) -> tuple[list[SimRequest], tuple[str, ...]]:
    """The waiting requests in the queue's serving order (loaded models get their reload
    time as warm credit), and the models they want in that order (look-ahead eviction)."""
    credit = {m: trace.load_time(m) for m in loaded}
    by_waiter = {id(waiters[id(r)]): r for r in waiting}
    ordered = [by_waiter[id(w)] for w in serving_order(
        [waiters[id(r)] for r in waiting], credit, order)]
    return ordered, tuple(dict.fromkeys(r.model for r in ordered))


def demand_of(trace: Trace, req: SimRequest, t: float, order: OrderPolicy) -> Demand:
    """What loading ``req``'s model (its one copy) asks of the planner at ``t`` (its aged
    priority)."""
    return Demand(slot_key(req.model), trace.sizes[req.model],
                  effective_priority(req.priority, t - req.arrival, order))


class _KnownRates:
    """Each model's mean request rate over the whole trace (what no online policy knows)."""

    def __init__(self, requests: list[SimRequest]) -> None:
        span = max((r.arrival for r in requests), default=0.0) or 1.0
        self._rates: dict[str, float] = {}
        for r in requests:
            self._rates[r.model] = self._rates.get(r.model, 0.0) + 1.0 / span

    def record(self, model_id: str, now: float) -> None:
        pass

    def rate(self, model_id: str, now: float) -> float:
        return self._rates.get(model_id, 0.0)


def with_settings(policy: SimPolicy, *, stay_warm_s: float | None = None) -> SimPolicy:
    return policy if stay_warm_s is None else replace(policy, stay_warm_s=stay_warm_s)


def wait_summary(result: Result) -> str:
    """``p<prio>: p50/p95`` seconds per priority."""
    return "  ".join(f"p{prio}: {statistics.median(w):.1f}/{pct(w, 0.95):.1f}"
                     for prio, w in sorted(result.waits.items()))
