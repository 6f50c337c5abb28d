"""A→B→A model switching: the CPU-RAM tier against the raw moves, and against stop-and-cold-load.

Two random-weight diffusion pipelines (a few hundred MB each) share a declared GPU that holds
one. Each switch is one image request (64×64, 1 step) for the model that is not resident, timed
by the client from request to image. Every answer carries the worker's own generation time, so
a switch's *cost* is measured apart from the generation (which on a busy box varies more than
the switch itself): the client time minus the generation, less the same for a warm request to
the resident model in the same run. That cost is set against the raw moves the worker makes
(its ``.to('cpu')`` of the evicted pipeline and ``.to(device)`` of the requested one, as it
reports them); ``observed/raw`` is the whole switch against generation + warm overhead + raw
moves. Runs, each on a fresh coordinator with the default ``reclaim_sleep_s`` (2 s):

- the CPU tier with this checkout's code;
- the CPU tier with another checkout's code (``--before DIR``, e.g. a worktree of an earlier
  commit), for a before/after in one run;
- the CPU tier off (``max_offloaded_mb: 0``; ``--skip-cold`` leaves it out): the evicted
  worker is stopped and the next switch starts a new one from disk.

    .venv/bin/python benchmarks/swap.py [--switches 6] [--width 256] [--before DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.harness import (
    BenchServer,
    coordinator_side,
    print_sides,
    same_except,
    worker_health,
)
from tests.diffusion_fixtures import build_tiny_sd_pipeline

GPU = {"gpus": [{"index": 0, "name": "sim-4g", "vram_mb": 4096}], "log_level": "WARNING",
       "reclaim_sleep_s": 2.0,  # the default
       "spare_workers": False}  # the cold side loads from disk; the spare is cold_start.py's
WARM_REQUESTS = 3


def manifest(model_id: str, path: Path) -> dict:
    return {"id": model_id, "category": "diffusion", "backend": "diffusers",
            "path": str(path), "vram_mb": 3000}


def image(server: BenchServer, model: str) -> tuple[float, float]:
    """One image request: the client's time to the image, and of that the time the worker
    spent generating (its own timings), so a busy box's slow generations cancel out."""
    started = time.perf_counter()
    response = httpx.post(server.url + "/v1/images/generations", timeout=600, json={
        "model": model, "prompt": "x", "size": "64x64", "x_steps": 1, "x_seed": 1})
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.text
    return elapsed, response.json()["x_model_boss"]["timings"]["total_s"]


def run(workdir: Path, paths: dict[str, Path], switches: int, cpu_tier: bool,
        checkout: Path | None = None) -> dict:
    config = dict(GPU, **({} if cpu_tier else {"max_offloaded_mb": 0}))
    server = BenchServer(workdir, config, [manifest(m, p) for m, p in paths.items()])
    if checkout is not None:
        server.checkout = checkout
    side = coordinator_side(server, switches=switches, warm_requests=WARM_REQUESTS)
    server.start()
    times, warm, loads = [], [], []
    try:
        order = ["A", "B"] * (switches // 2 + 1)
        for position, model in enumerate(order[:switches + 1]):
            timed = image(server, model)
            if position > 0:  # the first request is a plain cold start, not a switch
                times.append(timed)
            if position == 1:  # both loaded once: warm requests to the resident model
                warm = [image(server, model) for _ in range(WARM_REQUESTS)]
        events = httpx.get(server.url + "/api/v1/events?stream=false").json()["events"]
        for slot in server.status()["slots"]:
            if slot["port"]:
                loads.append(worker_health(slot)["load_s"])
    finally:
        server.stop()
    offloaded = [e for e in events if e["type"] == "offloaded"]
    return {"side": side, "switch": times, "warm": warm, "from_pretrained": loads,
            "to_cpu": [e.get("worker_seconds", e["seconds"]) for e in offloaded],
            "offload": [e["seconds"] for e in offloaded],
            "to_device": [e["worker_seconds"] for e in events if e["type"] == "onloaded"],
            "cold_start": [e["seconds"] for e in events if e["type"] == "loaded"]}


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def beyond_generation(timed: list[tuple[float, float]]) -> float:
    """Median of (client time − the worker's generation time) over requests."""
    return med([elapsed - generating for elapsed, generating in timed])


def summary(result: dict) -> dict[str, float]:
    """A switch's own cost: what it adds beyond a warm request (both without the
    generation), against the raw moves the worker makes (offload + onload)."""
    warm = beyond_generation(result["warm"])
    switch = beyond_generation(result["switch"])
    raw = med(result["to_cpu"]) + med(result["to_device"])
    generation = med([g for _, g in result["switch"]])
    return {"observed": med([e for e, _ in result["switch"]]), "generation": generation,
            "warm_overhead": warm, "switch_cost": switch - warm, "raw_moves": raw,
            "ratio": (generation + switch) / (generation + warm + raw)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--switches", type=int, default=6)
    parser.add_argument("--width", type=int, default=256, help="UNet width (model size)")
    parser.add_argument("--before", type=Path, default=None,
                        help="another checkout whose CPU-tier switch to measure alongside")
    parser.add_argument("--skip-cold", action="store_true",
                        help="leave out the run with the CPU tier off")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = {m: build_tiny_sd_pipeline(root / f"pipe-{m}", width=args.width)
                 for m in ("A", "B")}
        size_mb = sum(f.stat().st_size for f in paths["A"].rglob("*") if f.is_file()) / 2**20
        runs = {"this code": run(root / "tier", paths, args.switches, cpu_tier=True)}
        if args.before:
            runs[f"before ({args.before.name})"] = run(
                root / "before", paths, args.switches, cpu_tier=True,
                checkout=args.before.resolve())
        cold = None if args.skip_cold else run(root / "cold", paths, args.switches,
                                                cpu_tier=False)
    sides = {name: result["side"] for name, result in runs.items()}
    if cold is not None:
        sides["CPU tier off"] = cold["side"]
    print("sides compared (the CPU tier's code differs, or max_offloaded_mb 0 turns it off):")
    print_sides({k: dict(v, width=args.width) for k, v in sides.items()}, sep="=")
    for name in sides:
        if name != "this code":
            same_except({"this code": sides["this code"], name: sides[name]},
                        ["max_offloaded_mb"] if name == "CPU tier off" else ["code"])
    print(f"A->B->A switching, {args.switches} switches per run, pipelines of {size_mb:.0f} MB, "
          "CPU only (declared GPU), reclaim_sleep_s 2 (default), no spare worker; medians, seconds")
    print(f"{'CPU-tier switch':<22}{'observed':>10}{'generation':>12}{'switch cost':>13}"
          f"{'raw moves':>11}{'cost/raw':>10}{'observed/raw':>14}")
    for name, result in runs.items():
        row = summary(result)
        print(f"{name:<22}{row['observed']:>10.3f}{row['generation']:>12.3f}"
              f"{row['switch_cost']:>13.3f}{row['raw_moves']:>11.3f}"
              f"{row['switch_cost'] / row['raw_moves']:>10.2f}{row['ratio']:>14.2f}")
    tier = runs["this code"]
    print(f"of the raw moves: worker .to('cpu') {med(tier['to_cpu']):.3f}, .to(device) "
          f"{med(tier['to_device']):.3f}; coordinator offload (worker call + lease release) "
          f"{med(tier['offload']):.3f}; a warm request's time beyond generation "
          f"{summary(tier)['warm_overhead']:.3f}")
    if cold is not None:
        print(f"switch with stop + cold load from disk {med([e for e, _ in cold['switch']]):.3f}"
              f"; coordinator cold start of a worker {med(cold['cold_start']):.3f}; worker raw "
              f"from_pretrained {med(cold['from_pretrained'] + tier['from_pretrained']):.3f}")


if __name__ == "__main__":
    main()
