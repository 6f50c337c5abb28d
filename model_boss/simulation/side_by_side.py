"""Side-by-side simulation: loaded models serve at once, as the coordinator runs them.

:mod:`.simulator` serves one request at a time on the whole GPU and stops serving while a
model loads. The coordinator does neither: every loaded model has its own worker, each takes
up to ``parallel`` requests at once, and a load runs while the other models go on serving.
This replay keeps the coordinator's dispatch rule (requests in :func:`~.ordering.serving_order`;
a model that is not loaded goes through :func:`~.planner.plan` with the busy models as they
are; a model that waits for room holds back grants on the models it waits for) and adds:

- up to ``parallel`` requests run at once on a loaded model; loading models serve nothing;
- a load takes its seconds while the others serve (loads do not share the disk);
- the GPU's compute is shared (processor sharing): with ``k`` models running requests at
  once, each request advances at ``1/k`` of its speed alone; requests on one model batch
  (``parallel`` of them take the time of one), which is the optimistic end for llama.cpp's
  slots and the reason ``parallel`` is a knob here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..scheduling.eviction import SlotView
from ..scheduling.ordering import STRICT, Waiter, rank_on_arrival
from ..scheduling.planner import Evict, Fit, Snapshot, Wait, plan
from ..scheduling.rates import RequestRates
from ..slot_key import model_of, slot_key
from .simulator import Result, SimPolicy, SimRequest, Trace, demand_of, in_serving_order

EPSILON = 1e-9


@dataclass
class _Loaded:
    """A model with VRAM: loading until ``ready_at``, then serving ``running``."""

    last_used: float
    last_priority: int
    ready_at: float
    running: dict[int, float] = field(default_factory=dict)  # id(request) -> work left, s


def simulate_side_by_side(trace: Trace, policy: SimPolicy, parallel: int = 1) -> Result:
    """Replay ``trace`` with loaded models serving side by side, ``parallel`` requests each.
    Only the planner policies (``today``, ``model-boss``) run here; every request is served
    exactly once."""
    if policy.evictor != "planner":
        raise ValueError(f"{policy.name}: side by side runs the planner policies only")
    return _SideBySide(trace, policy, parallel).run()


class _SideBySide:
    def __init__(self, trace: Trace, policy: SimPolicy, parallel: int) -> None:
        self.trace, self.policy, self.parallel = trace, policy, max(1, parallel)
        self.order = policy.order or STRICT
        self.requests = sorted(trace.requests, key=lambda r: r.arrival)
        self.loaded: dict[str, _Loaded] = {}
        self.rates = RequestRates()
        self.result = Result()
        self.waiting: list[SimRequest] = []
        self.waiters: dict[int, Waiter] = {}

    def run(self) -> Result:
        t, arrived = 0.0, 0
        while arrived < len(self.requests) or self.waiting or self._running():
            while arrived < len(self.requests) and self.requests[arrived].arrival <= t + EPSILON:
                self._arrive(self.requests[arrived])
                arrived += 1
            self._dispatch(t)
            upcoming = [self.requests[arrived].arrival] if arrived < len(self.requests) else []
            t = self._advance(t, upcoming)
        return self.result

    # -- events -----------------------------------------------------------------------------

    def _arrive(self, req: SimRequest) -> None:
        rank = rank_on_arrival((self.waiters[id(r)] for r in self.waiting), req.client,
                               req.priority)
        self.waiting.append(req)
        self.waiters[id(req)] = Waiter(req.model, req.priority, req.client, req.arrival, rank)

    def _running(self) -> bool:
        return any(m.running for m in self.loaded.values())

    def _advance(self, t: float, upcoming: list[float]) -> float:
        """Move the clock to the next event (an arrival, a load done, a request done, an
        aging step or a keep-alive end while requests wait) and run the requests until then."""
        busy = [m for m in self.loaded.values() if m.running]
        share = len(busy)  # models computing at once share the GPU
        events = list(upcoming)
        events += [m.ready_at for m in self.loaded.values() if m.ready_at > t]
        events += [t + left * share for m in busy for left in m.running.values()]
        if self.waiting:
            if self.order.aging_s > 0:
                events.append(t + self.order.aging_s)
            events += [m.last_used + self.policy.stay_warm_s for m in self.loaded.values()
                       if m.last_used + self.policy.stay_warm_s > t]
        nxt = min((e for e in events if e > t), default=t + 1.0)
        for model in busy:
            for key in list(model.running):
                model.running[key] -= (nxt - t) / share
                if model.running[key] <= EPSILON:
                    del model.running[key]
                    model.last_used = nxt
        return nxt

    # -- decisions: the coordinator's order and planner ------------------------------------

    def _dispatch(self, t: float) -> None:
        """Grant and load until nothing more can start at ``t``."""
        while self.waiting and self._one_step(t):
            pass

    def _one_step(self, t: float) -> bool:
        ordered, wanted = in_serving_order(self.trace, self.waiting, self.waiters, self.loaded,
                                           self.order)
        draining: set[str] = set()
        considered: set[str] = set()
        for req in ordered:
            model = self.loaded.get(req.model)
            if model is not None:
                if model.ready_at <= t and req.model not in draining \
                        and len(model.running) < self.parallel:
                    self._grant(req, model, t)
                    return True
                continue
            if req.model in considered:
                continue
            considered.add(req.model)
            decision = plan(demand_of(self.trace, req, t, self.order),
                            self._snapshot(t, wanted))
            if isinstance(decision, Evict | Fit):
                for victim in getattr(decision, "victims", ()):
                    del self.loaded[model_of(victim)]
                self._load(req, t)
                return True
            if isinstance(decision, Wait):
                draining.update(map(model_of, decision.blocking))
        return False

    def _grant(self, req: SimRequest, model: _Loaded, t: float) -> None:
        if any(o is not req and o.priority < req.priority and o.arrival <= req.arrival
               for o in self.waiting):
            self.result.inversions += 1
        self.waiting.remove(req)
        self.result.waits.setdefault(req.priority, []).append(t - req.arrival)
        self.rates.record(req.model, t)
        model.running[id(req)] = max(req.duration, EPSILON)
        model.last_used, model.last_priority = t, req.priority

    def _load(self, req: SimRequest, t: float) -> None:
        seconds = self.trace.load_time(req.model)
        self.result.cold_loads += 1
        self.result.load_s += seconds
        self.loaded[req.model] = _Loaded(t, req.priority, t + seconds)
        used = sum(self.trace.sizes[m] for m in self.loaded)
        self.result.peak_mb = max(self.result.peak_mb, used)

    def _snapshot(self, t: float, wanted: tuple[str, ...]) -> Snapshot:
        ahead = self.policy.look_ahead
        views = tuple(
            SlotView(slot_key(name), "ready" if m.ready_at <= t else "loading", False,
                     len(m.running), m.last_used, m.last_priority,
                     m.last_used + self.policy.stay_warm_s,
                     {0: self.trace.sizes[name]},
                     reload_s=self.trace.load_time(name) if ahead else 0.0,
                     rate_per_s=self.rates.rate(name, t) if ahead else 0.0)
            for name, m in self.loaded.items())
        used = sum(self.trace.sizes[m] for m in self.loaded)
        capacity = self.trace.capacity_mb
        return Snapshot({0: capacity - used}, {0: capacity}, views, t,
                        wanted if ahead else (), prune=ahead)


__all__ = ["simulate_side_by_side"]
