"""Replay request traces through the scheduler's own ordering and planner.

The simulation lives in the package (:mod:`model_boss.simulation.simulator`, also behind
``model-boss simulate``); this benchmark prints two tables, each against baselines from the
same run:

1. cold loads and seconds spent loading per trace and policy, as ratios to Belady (the
   offline optimum for the count of cold loads under FIFO), with ``known-rates`` (the
   planner told each model's true request rate) as the bound of rate-based prediction;
2. the same ratios for ``model-boss`` and ``known-rates`` over the workshop seeds 1–20;
3. waits per priority on the bursty trace, today's policy against the new one at several
   aging rates (``aging_s``), with the p95 ratios to today's: one request at a time on the
   whole GPU, then loaded models side by side with 1 and 4 slots each, as the coordinator
   serves (:mod:`model_boss.simulation.side_by_side`).

    .venv/bin/python benchmarks/scheduler_sim.py [--seed 7] [--seeds 20] [--trace log.jsonl]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from model_boss.scheduling.ordering import OrderPolicy
from model_boss.simulation.side_by_side import simulate_side_by_side
from model_boss.simulation.simulator import (
    KNOWN_RATES,
    MODEL_BOSS,
    POLICIES,
    TODAY,
    Result,
    SimPolicy,
    Trace,
    simulate,
    wait_summary,
)
from model_boss.simulation.traces import bursty_trace, jsonl_trace, workshop_trace


def belady_table(traces: list[Trace]) -> list[dict]:
    rows = []
    print(f"{'trace':<34}{'policy':<15}{'cold':>6}{'xBelady':>8}{'load s':>8}{'xBelady':>8}"
          f"{'inv':>5}{'peak GB':>8}  wait p50/p95 s per priority")
    for trace in traces:
        results = {p.name: simulate(trace, p) for p in [*POLICIES, KNOWN_RATES]}
        best = results["belady"]
        for policy, res in results.items():
            print(f"{trace.name:<34}{policy:<15}{res.cold_loads:>6}"
                  f"{res.cold_loads / max(1, best.cold_loads):>8.2f}{res.load_s:>8.0f}"
                  f"{res.load_s / max(1e-9, best.load_s):>8.2f}{res.inversions:>5}"
                  f"{res.peak_mb / 1024:>8.1f}  {wait_summary(res)}")
            rows.append({"trace": trace.name, "policy": policy, "cold": res.cold_loads,
                         "ratio": res.cold_loads / max(1, best.cold_loads)})
    return rows


def seeds_table(seeds: range) -> None:
    """Cold loads and load seconds against Belady's on each workshop seed."""
    print(f"\nworkshop seeds {seeds.start}-{seeds.stop - 1}: x Belady, cold loads / load seconds")
    print(f"{'seed':>4}{'models':>7}{'belady':>7}" + "".join(
        f"{name:>22}" for name in (MODEL_BOSS.name, KNOWN_RATES.name)))
    worst = {MODEL_BOSS.name: [0.0, 0.0], KNOWN_RATES.name: [0.0, 0.0]}
    for seed in seeds:
        trace = workshop_trace(seed)
        best = simulate(trace, next(p for p in POLICIES if p.name == "belady"))
        cells = ""
        for policy in (MODEL_BOSS, KNOWN_RATES):
            res = simulate(trace, policy)
            count, secs = res.cold_loads / max(1, best.cold_loads), res.load_s / best.load_s
            worst[policy.name] = [max(worst[policy.name][0], count),
                                  max(worst[policy.name][1], secs)]
            cells += f"{res.cold_loads:>9} {count:>4.2f} / {secs:>4.2f}"
        print(f"{seed:>4}{len(trace.sizes):>7}{best.cold_loads:>7}{cells}")
    print(f"{'worst':>18}" + "".join(f"{'':>9} {c:>4.2f} / {s:>4.2f}"
                                      for c, s in worst.values()))


def waits_table(trace: Trace, agings: list[float], parallel: int | None = None) -> list[dict]:
    """Waits per priority, today's policy against the new one at several ``aging_s``; one
    request at a time on the whole GPU, or (``parallel``) loaded models side by side with
    that many slots each."""
    def run(policy: SimPolicy) -> Result:
        return simulate(trace, policy) if parallel is None else \
            simulate_side_by_side(trace, policy, parallel)

    base = run(TODAY)
    how = "one request at a time" if parallel is None else \
        f"side by side, parallel {parallel}"
    print(f"\n{trace.name}, {how}: waits per priority, p50 / p95 s (ratio of p95 to today's)")
    print(f"{'policy':<26}{'cold':>6}  " + "".join(f"{'p' + str(p):>24}" for p in (0, 5, 9)))
    rows = []
    for name, policy in [("today", TODAY)] + [
            (f"model-boss aging_s={a:g}", replace(MODEL_BOSS, order=OrderPolicy(aging_s=a)))
            for a in agings]:
        res = base if policy is TODAY else run(policy)
        cells = ""
        for prio in (0, 5, 9):
            p50, p95 = res.wait_pct(prio, 0.5), res.wait_pct(prio, 0.95)
            ratio = p95 / max(1e-9, base.wait_pct(prio, 0.95))
            cells += f"{p50:>8.1f} / {p95:>6.1f} ({ratio:>4.2f}x)"
        print(f"{name:<26}{res.cold_loads:>6}  {cells}")
        rows.append({"policy": name, **{f"p{q}_p95": res.wait_pct(q, 0.95) for q in (0, 5, 9)}})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--seeds", type=int, default=20, help="workshop seeds 1..N swept")
    parser.add_argument("--trace", type=Path, help="a JSONL request log to replay as well")
    parser.add_argument("--capacity-mb", type=int, default=24576)
    args = parser.parse_args()
    traces = [workshop_trace(args.seed), workshop_trace(args.seed + 1),
              bursty_trace(args.seed)]
    if args.trace:
        traces.append(jsonl_trace(args.trace, args.capacity_mb))
    belady_table(traces)
    seeds_table(range(1, args.seeds + 1))
    for parallel in (None, 1, 4):
        waits_table(bursty_trace(args.seed), [2, 10, 30, 70], parallel)


if __name__ == "__main__":
    main()
