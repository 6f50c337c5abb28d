"""Replay request traces through the scheduler's real decision functions.

A discrete-event simulation of one GPU serving one request at a time, with simulated load
and inference times. The policies compared:

- ``model-boss``: the project's rules — queue order ``(priority, warm_bump, submitted_at)``,
  eviction through :func:`evict_candidates` / :func:`victims_for` (priority-aware, stay-warm);
- ``one-at-a-time``: only one model resident, swap on every change;
- ``lru``: FIFO order, evict the least recently used model, priorities ignored;
- ``belady``: FIFO order, evict the model whose next use is farthest away (offline optimum
  for cold loads under FIFO).

Traces: a seeded synthetic workshop, a bursty multi-client trace with priority classes, and
any JSONL request log (``{"timestamp", "model", "priority", "duration"}`` per line, with
optional ``"size_mb"``).

    .venv/bin/python benchmarks/scheduler_sim.py [--seed 7] [--trace log.jsonl]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from model_boss.inference.eviction import SlotView, evict_candidates, victims_for

LOAD_S_PER_GB = 1.5  # simulated cold load: a fixed second plus size-proportional reading
STAY_WARM_S = 300.0


@dataclass(slots=True)
class Request:
    arrival: float
    model: str
    priority: int
    duration: float
    start: float | None = None


@dataclass
class Trace:
    name: str
    requests: list[Request]
    sizes: dict[str, int]  # MB
    capacity_mb: int


@dataclass
class Resident:
    model: str
    last_used: float
    last_priority: int


@dataclass
class Result:
    cold_loads: int = 0
    inversions: int = 0
    peak_mb: int = 0
    waits: dict[int, list[float]] = field(default_factory=dict)


def load_s(size_mb: int) -> float:
    return 1.0 + LOAD_S_PER_GB * size_mb / 1024


# -- traces -------------------------------------------------------------------------------

def workshop_trace(seed: int, count: int = 400) -> Trace:
    """3–6 models of mixed sizes, Zipf-ish popularity, sessions that switch often."""
    rng = random.Random(seed)
    n = rng.randint(3, 6)
    models = [f"m{i}" for i in range(n)]
    sizes = {m: rng.choice([2048, 4096, 6144, 9216, 12288]) for m in models}
    weights = [1 / (i + 1) for i in range(n)]
    requests, t = [], 0.0
    while len(requests) < count:
        model = rng.choices(models, weights)[0]
        for _ in range(rng.randint(1, 4)):  # a participant's short session
            t += rng.expovariate(1 / 8.0)
            requests.append(Request(t, model, 5, rng.uniform(1, 6)))
    return Trace(f"workshop (seed {seed})", requests[:count], sizes, 16384)


def bursty_trace(seed: int, count: int = 400) -> Trace:
    """Interactive (0), normal (5) and batch (9) clients in bursts on different models."""
    rng = random.Random(seed + 1000)
    sizes = {"chat-small": 3072, "chat-big": 9216, "coder": 7168, "image": 12288,
             "batch-big": 14336}
    classes = [(0, ["chat-small", "chat-big"], 0.45), (5, ["coder", "image"], 0.35),
               (9, ["batch-big", "image"], 0.20)]
    requests, t = [], 0.0
    while len(requests) < count:
        priority, models, _ = rng.choices(classes, [c[2] for c in classes])[0]
        model = rng.choice(models)
        for _ in range(rng.randint(1, 6)):
            t += rng.expovariate(1 / 6.0)
            duration = rng.uniform(0.5, 3) if priority == 0 else rng.uniform(2, 8)
            requests.append(Request(t, model, priority, duration))
    return Trace(f"bursty multi-client (seed {seed})", requests[:count], sizes, 24576)


def jsonl_trace(path: Path, capacity_mb: int) -> Trace:
    requests, sizes = [], {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        requests.append(Request(float(item["timestamp"]), item["model"],
                                int(item.get("priority", 5)), float(item["duration"])))
        sizes[item["model"]] = int(item.get("size_mb", sizes.get(item["model"], 4096)))
    start = min(r.arrival for r in requests)
    for r in requests:
        r.arrival -= start
    return Trace(f"jsonl {path.name}", sorted(requests, key=lambda r: r.arrival), sizes,
                 capacity_mb)


# -- simulation ---------------------------------------------------------------------------

def simulate(trace: Trace, policy: str) -> Result:
    requests = [Request(r.arrival, r.model, r.priority, r.duration) for r in trace.requests]
    future_uses: dict[str, list[float]] = {}
    for r in requests:
        future_uses.setdefault(r.model, []).append(r.arrival)
    resident: dict[str, Resident] = {}
    result = Result()
    t, arrived, waiting = 0.0, 0, []
    capacity = trace.capacity_mb

    def used() -> int:
        return sum(trace.sizes[m] for m in resident)

    def next_use(model: str, now: float) -> float:
        return next((a for a in future_uses[model] if a >= now), float("inf"))

    def make_room(req: Request, now: float) -> bool:
        """Evict per policy until req's model fits; False if the policy forbids it now."""
        need = trace.sizes[req.model]
        if policy == "one-at-a-time":
            resident.clear()
            return True
        free = capacity - used()
        if policy == "model-boss":
            views = [SlotView(r.model, "ready", False, 0, r.last_used, r.last_priority,
                              r.last_used + STAY_WARM_S, {0: trace.sizes[r.model]})
                     for r in resident.values()]
            victims = victims_for(need, {0: free}, evict_candidates(views, req.priority, now))
            if victims is None:
                return False
            for victim in victims:
                del resident[victim.model_id]
            return True
        while free < need:
            if policy == "lru":
                victim = min(resident.values(), key=lambda r: r.last_used).model
            else:  # belady
                victim = max(resident, key=lambda m: next_use(m, now))
            del resident[victim]
            free = capacity - used()
        return True

    def order(queue: list[Request]) -> list[Request]:
        if policy == "model-boss":
            return sorted(queue, key=lambda r: (r.priority, r.model not in resident, r.arrival))
        return sorted(queue, key=lambda r: r.arrival)

    while arrived < len(requests) or waiting:
        while arrived < len(requests) and requests[arrived].arrival <= t:
            waiting.append(requests[arrived])
            arrived += 1
        if not waiting:
            t = requests[arrived].arrival
            continue
        chosen = None
        for req in order(waiting):
            if req.model in resident or trace.sizes[req.model] <= capacity - used() \
                    or make_room(req, t):
                chosen = req
                break
        if chosen is None:  # everything waits for a stay-warm to run out or a new arrival
            expiries = [r.last_used + STAY_WARM_S for r in resident.values()]
            nxt = min([e for e in expiries if e > t] +
                      ([requests[arrived].arrival] if arrived < len(requests) else []))
            t = max(t + 1e-6, nxt)
            continue
        # priority inversion: a more important waiter that could have run was passed over
        for other in waiting:
            if other is not chosen and other.priority < chosen.priority \
                    and other.arrival <= chosen.arrival:
                result.inversions += 1
                break
        waiting.remove(chosen)
        if chosen.model not in resident:
            if trace.sizes[chosen.model] > capacity - used():
                make_room(chosen, t)
            result.cold_loads += 1
            t += load_s(trace.sizes[chosen.model])
            resident[chosen.model] = Resident(chosen.model, t, chosen.priority)
        result.peak_mb = max(result.peak_mb, used())
        chosen.start = t
        result.waits.setdefault(chosen.priority, []).append(t - chosen.arrival)
        t += chosen.duration
        resident[chosen.model].last_used = t
        resident[chosen.model].last_priority = chosen.priority
    return result


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


POLICIES = ["model-boss", "one-at-a-time", "lru", "belady"]


def report(traces: list[Trace]) -> list[dict]:
    rows = []
    print(f"{'trace':<34}{'policy':<15}{'cold':>6}{'xBelady':>8}{'inv':>5}{'peak GB':>8}  "
          "wait p50/p95 s per priority")
    for trace in traces:
        results = {p: simulate(trace, p) for p in POLICIES}
        best = max(1, results["belady"].cold_loads)
        for policy, res in results.items():
            waits = "  ".join(f"p{prio}: {statistics.median(w):.1f}/{pct(w, 0.95):.1f}"
                              for prio, w in sorted(res.waits.items()))
            print(f"{trace.name:<34}{policy:<15}{res.cold_loads:>6}"
                  f"{res.cold_loads / best:>8.2f}{res.inversions:>5}"
                  f"{res.peak_mb / 1024:>8.1f}  {waits}")
            rows.append({"trace": trace.name, "policy": policy, "cold": res.cold_loads,
                         "ratio": res.cold_loads / best, "inversions": res.inversions,
                         "peak_mb": res.peak_mb})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--trace", type=Path, help="a JSONL request log to replay as well")
    parser.add_argument("--capacity-mb", type=int, default=24576)
    args = parser.parse_args()
    traces = [workshop_trace(args.seed), workshop_trace(args.seed + 1),
              bursty_trace(args.seed)]
    if args.trace:
        traces.append(jsonl_trace(args.trace, args.capacity_mb))
    report(traces)


if __name__ == "__main__":
    main()
