"""Replay request traces through the scheduler's own ordering and planner.

The simulation lives in the package (:mod:`model_boss.inference.simulator`, also behind
``model-boss simulate``); this benchmark prints two tables, each against baselines from the
same run:

1. cold loads per trace and policy, as a ratio to Belady (the offline optimum under FIFO);
2. waits per priority on the bursty trace, today's policy against the new one at several
   aging rates (``aging_s``), with the p95 ratios to today's.

    .venv/bin/python benchmarks/scheduler_sim.py [--seed 7] [--trace log.jsonl]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from model_boss.inference.ordering import OrderPolicy
from model_boss.inference.simulator import (
    MODEL_BOSS,
    POLICIES,
    TODAY,
    Trace,
    simulate,
    wait_summary,
)
from model_boss.inference.traces import bursty_trace, jsonl_trace, workshop_trace


def belady_table(traces: list[Trace]) -> list[dict]:
    rows = []
    print(f"{'trace':<34}{'policy':<15}{'cold':>6}{'xBelady':>8}{'inv':>5}{'peak GB':>8}  "
          "wait p50/p95 s per priority")
    for trace in traces:
        results = {p.name: simulate(trace, p) for p in POLICIES}
        best = max(1, results["belady"].cold_loads)
        for policy, res in results.items():
            print(f"{trace.name:<34}{policy:<15}{res.cold_loads:>6}"
                  f"{res.cold_loads / best:>8.2f}{res.inversions:>5}"
                  f"{res.peak_mb / 1024:>8.1f}  {wait_summary(res)}")
            rows.append({"trace": trace.name, "policy": policy, "cold": res.cold_loads,
                         "ratio": res.cold_loads / best})
    return rows


def waits_table(trace: Trace, agings: list[float]) -> list[dict]:
    base = simulate(trace, TODAY)
    print(f"\n{trace.name}: waits per priority, p50 / p95 s (ratio of p95 to today's)")
    print(f"{'policy':<26}{'cold':>6}  " + "".join(f"{'p' + str(p):>24}" for p in (0, 5, 9)))
    rows = []
    for name, policy in [("today", TODAY)] + [
            (f"model-boss aging_s={a:g}", replace(MODEL_BOSS, order=OrderPolicy(aging_s=a)))
            for a in agings]:
        res = base if policy is TODAY else simulate(trace, policy)
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
    parser.add_argument("--trace", type=Path, help="a JSONL request log to replay as well")
    parser.add_argument("--capacity-mb", type=int, default=24576)
    args = parser.parse_args()
    traces = [workshop_trace(args.seed), workshop_trace(args.seed + 1),
              bursty_trace(args.seed)]
    if args.trace:
        traces.append(jsonl_trace(args.trace, args.capacity_mb))
    belady_table(traces)
    waits_table(bursty_trace(args.seed), [2, 10, 30, 70])


if __name__ == "__main__":
    main()
