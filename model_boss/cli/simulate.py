"""``model-boss simulate``: replay a request log through the scheduler to size hardware and
settings from one's own traffic.

It runs the coordinator's own ordering and planner (:mod:`model_boss.simulation.simulator`)
over the log the daemon writes (``state_dir/requests.jsonl``) and prints cold loads against
Belady's optimum, waits per priority, and what another keep-alive or VRAM size would change;
with ``--parallel N`` also the waits with loaded models side by side, N slots each, as the
coordinator serves (:mod:`model_boss.simulation.side_by_side`). ``--replicas N`` instead
replays one model's requests (a synthetic burst without ``--trace``) over at most 1..N copies
of it, started by the coordinator's own replica rule (:mod:`model_boss.simulation.replicas`).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import replace
from pathlib import Path

from ..errors import BadRequest
from ..scheduling.ordering import OrderPolicy
from ..simulation.replicas import ReplicaSettings, busiest_model, requests_of, simulate_replicas
from ..simulation.side_by_side import simulate_side_by_side
from ..simulation.simulator import MODEL_BOSS, POLICIES, TODAY, Result, SimPolicy, Trace, simulate
from ..simulation.traces import burst_trace, jsonl_trace
from .client import DaemonClient
from .command import Subparsers, add_command

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([gGmM]?)[bB]?\s*$")


EXAMPLE = ("model-boss simulate --trace ~/.local/state/model-boss/requests.jsonl --gpus 24G "
           "--parallel 2")


def add_parser(sub: Subparsers) -> None:
    parser = add_command(sub, "simulate", run, summary="replay a request log through the "
                         "scheduler", description="Replay a request log through the scheduler.",
                         examples=(EXAMPLE,))
    parser.add_argument("--trace", type=Path,
                        help="request log (state_dir/requests.jsonl); needed unless "
                             "--replicas is given")
    parser.add_argument("--gpus",
                        help="VRAM per GPU, comma-separated: 24576 or 24G,24G (one pool); "
                             "needed unless --replicas is given")
    parser.add_argument("--keep-alive", type=float, default=300.0,
                        help="seconds an idle model stays loaded (default 300)")
    parser.add_argument("--aging-s", type=float, default=2.0,
                        help="seconds of waiting per priority level (default 2)")
    parser.add_argument("--parallel", type=int, default=0, metavar="N",
                        help="also replay with loaded models serving side by side, N "
                             "requests at once each (the manifests' parallel); with "
                             "--replicas, the requests one copy runs at once (default 1)")
    parser.add_argument("--replicas", type=int, default=0, metavar="N",
                        help="only replay one model over at most 1..N copies of it, side by "
                             "side (no --trace: a synthetic burst)")
    parser.add_argument("--model", help="with --replicas: the model to replay (default: "
                                         "the one with the most requests)")
    parser.add_argument("--scale-wait-s", type=float, default=2.0,
                        help="with --replicas: the first waiter's wait before one more copy "
                             "(replica_scale_wait_s, default 2)")


def parse_gpus(text: str) -> int:
    """Total MB from ``24576`` / ``24G,24G``; a clear error otherwise."""
    total = 0
    for part in text.split(","):
        match = _SIZE.match(part)
        if not match:
            raise BadRequest(f"--gpus: '{part}' is not a VRAM size (e.g. 24576 or 24G)")
        value, unit = float(match.group(1)), match.group(2).lower()
        total += int(value * 1024) if unit == "g" else int(value)
    if total <= 0:
        raise BadRequest("--gpus: the VRAM must be more than 0")
    return total


def run(args: argparse.Namespace, client: DaemonClient) -> int:
    """Replay offline (no daemon: ``client`` unused)."""
    if args.replicas > 0:
        return _replicas(args)
    try:
        if args.trace is None or args.gpus is None:
            raise BadRequest("--trace and --gpus are needed (or --replicas N)")
        capacity = parse_gpus(args.gpus)
        if not args.trace.is_file():
            raise BadRequest(f"--trace: {args.trace} is not a file")
        trace = jsonl_trace(args.trace, capacity)
    except BadRequest as exc:
        print(f"model-boss simulate: {exc.message}")
        return 2
    policy = replace(MODEL_BOSS, order=OrderPolicy(aging_s=args.aging_s),
                     stay_warm_s=args.keep_alive)
    too_big = [m for m, mb in trace.sizes.items() if mb > capacity]
    if too_big:
        print(f"never fits in {capacity} MB: {', '.join(sorted(too_big))} (left out)")
        trace = replace(trace, requests=[r for r in trace.requests if r.model not in too_big])
    print(f"{trace.name}: {len(trace.requests)} requests, {len(trace.sizes)} models, "
          f"{capacity} MB of VRAM, keep-alive {args.keep_alive:g} s, aging {args.aging_s:g} s\n")
    _policies(trace, policy)
    _what_if(trace, policy, capacity)
    if args.parallel > 0:
        _side_by_side(trace, policy, args.parallel)
    return 0


def _side_by_side(trace: Trace, policy: SimPolicy, parallel: int) -> None:
    print(f"\nside by side ({parallel} at once per loaded model; the GPU shared by the "
          "models running at once):")
    _wait_table({
        "today": simulate_side_by_side(
            trace, replace(TODAY, stay_warm_s=policy.stay_warm_s), parallel),
        MODEL_BOSS.name: simulate_side_by_side(trace, policy, parallel)})


def _wait_table(results: dict[str, Result], belady: Result | None = None) -> None:
    """Cold loads (and their ratio to Belady's when given) and waits per priority."""
    priorities = sorted(results[MODEL_BOSS.name].waits)
    ratio = f"{'x Belady':>9}" if belady else ""
    print(f"{'policy':<15}{'cold loads':>11}{ratio}  " +
          "".join(f"{'p' + str(p) + ' wait p50/p95 s':>24}" for p in priorities))
    for name, res in results.items():
        cells = "".join(f"{res.wait_pct(p, 0.5):>15.1f} / {res.wait_pct(p, 0.95):<6.1f}"
                        for p in priorities)
        times = f"{res.cold_loads / max(1, belady.cold_loads):>9.2f}" if belady else ""
        print(f"{name:<15}{res.cold_loads:>11}{times}  {cells}")


def _policies(trace: Trace, policy: SimPolicy) -> None:
    results = {p.name: simulate(trace, replace(p, stay_warm_s=policy.stay_warm_s))
               for p in POLICIES if p.name != MODEL_BOSS.name}
    results[MODEL_BOSS.name] = simulate(trace, policy)
    _wait_table(results, results["belady"])


def _what_if(trace: Trace, policy: SimPolicy, capacity: int) -> None:
    print("\nwhat if (model-boss policy):")
    base = simulate(trace, policy)
    rows = [(f"keep-alive {k:g} s", replace(policy, stay_warm_s=k), trace)
            for k in (60.0, 300.0, 900.0, 3600.0) if k != policy.stay_warm_s]
    rows += [(f"VRAM {int(capacity * f)} MB", policy, replace(trace, capacity_mb=int(
        capacity * f))) for f in (0.5, 1.5, 2.0)
        if all(mb <= capacity * f for mb in trace.sizes.values())]
    priorities = sorted(base.waits)
    print(f"{'change':<24}{'cold loads':>11}  " +
          "".join(f"{'p' + str(p) + ' wait p95 s':>18}" for p in priorities))
    print(f"{'(as given)':<24}{base.cold_loads:>11}  " +
          "".join(f"{base.wait_pct(p, 0.95):>18.1f}" for p in priorities))
    for label, variant, variant_trace in rows:
        res = simulate(variant_trace, variant)
        print(f"{label:<24}{res.cold_loads:>11}  " +
              "".join(f"{res.wait_pct(p, 0.95):>18.1f}" for p in priorities))


def _replicas(args: argparse.Namespace) -> int:
    """One model's waits, copies started and copy-seconds for at most 1..N copies."""
    try:
        if args.trace is None:
            trace = burst_trace(seed=1)
        elif not args.trace.is_file():
            raise BadRequest(f"--trace: {args.trace} is not a file")
        else:
            trace = jsonl_trace(args.trace, parse_gpus(args.gpus) if args.gpus else 0)
        model = args.model or busiest_model(trace)
        if model not in trace.sizes:
            raise BadRequest(f"--model: no requests for '{model}' in the trace")
    except BadRequest as exc:
        print(f"model-boss simulate: {exc.message}")
        return 2
    base = ReplicaSettings(parallel=max(1, args.parallel), load_s=trace.load_time(model),
                           keep_alive_s=args.keep_alive, wait_s=args.scale_wait_s)
    requests = requests_of(trace, model)
    print(f"{trace.name}: {len(requests)} requests for {model}, load {base.load_s:.1f} s, "
          f"{base.parallel} at once per copy, one more copy after a "
          f"{base.wait_s:g} s wait, keep-alive {base.keep_alive_s:g} s\n")
    print(f"{'max copies':>10}{'wait p50/p95 s':>20}{'p50 x max 1':>13}"
          f"{'copies started':>16}{'peak':>6}{'copy-s':>10}")
    first = 0.0
    for n in range(1, args.replicas + 1):
        res = simulate_replicas(requests, replace(base, max_replicas=n), model)
        p50 = res.wait_pct(0.5)
        first = p50 if n == 1 else first
        ratio = f"{p50 / first:.2f}" if first > 0 else "-"
        print(f"{n:>10}{p50:>12.1f} / {res.wait_pct(0.95):<5.1f}{ratio:>13}"
              f"{res.started:>16}{res.peak:>6}{res.copy_s:>10.0f}")
    return 0
