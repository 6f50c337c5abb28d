"""A→B→A model switching: the CPU-RAM tier against the raw moves, and against stop-and-cold-load.

Two random-weight diffusion pipelines (a few hundred MB each) share a declared GPU that holds
one. Each switch is one image request (64×64, 1 step) for the model that is not resident, timed
by the client from request to image. The raw cost of the same switch is what the worker itself
spends: its ``.to('cpu')`` of the evicted pipeline, its ``.to(device)`` of the requested one
(both as the worker reports them), plus a warm request to a resident model in the same run (the
generation is part of every switch). Runs, each on a fresh coordinator with the default
``reclaim_sleep_s`` (2 s):

- the CPU tier with this checkout's code;
- the CPU tier with another checkout's code (``--before DIR``, e.g. a worktree of an earlier
  commit), for a before/after in one run;
- the CPU tier off (``max_offloaded_mb: 0``): the evicted worker is stopped and the next switch
  starts a new one from disk.

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
from tests.conftest import ServerProcess
from tests.diffusion_fixtures import build_tiny_sd_pipeline

GPU = {"gpus": [{"index": 0, "name": "sim-4g", "vram_mb": 4096}], "log_level": "WARNING",
       "reclaim_sleep_s": 2.0}  # the default; the test fixture's server sets 0
WARM_REQUESTS = 3


def manifest(model_id: str, path: Path) -> dict:
    return {"id": model_id, "category": "diffusion", "backend": "diffusers",
            "path": str(path), "vram_mb": 3000}


def image(server: ServerProcess, model: str) -> float:
    started = time.perf_counter()
    response = httpx.post(server.url + "/v1/images/generations", timeout=600, json={
        "model": model, "prompt": "x", "size": "64x64", "x_steps": 1, "x_seed": 1})
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.text
    return elapsed


def run(workdir: Path, paths: dict[str, Path], switches: int, cpu_tier: bool,
        checkout: Path | None = None) -> dict:
    config = dict(GPU, **({} if cpu_tier else {"max_offloaded_mb": 0}))
    server = ServerProcess(workdir, config, [manifest(m, p) for m, p in paths.items()])
    if checkout is not None:
        server.checkout = checkout
    server.start()
    times, warm, loads = [], [], []
    try:
        order = ["A", "B"] * (switches // 2 + 1)
        for position, model in enumerate(order[:switches + 1]):
            elapsed = image(server, model)
            if position > 0:  # the first request is a plain cold start, not a switch
                times.append(elapsed)
            if position == 1:  # both loaded once: warm requests to the resident model
                warm = [image(server, model) for _ in range(WARM_REQUESTS)]
        events = httpx.get(server.url + "/api/v1/events?stream=false").json()["events"]
        for slot in server.status()["slots"]:
            if slot["port"]:
                loads.append(worker_health(slot)["load_s"])
    finally:
        server.stop()
    offloaded = [e for e in events if e["type"] == "offloaded"]
    return {"switch": times, "warm": warm, "from_pretrained": loads,
            "to_cpu": [e.get("worker_seconds", e["seconds"]) for e in offloaded],
            "offload": [e["seconds"] for e in offloaded],
            "to_device": [e["worker_seconds"] for e in events if e["type"] == "onloaded"],
            "cold_start": [e["seconds"] for e in events if e["type"] == "loaded"]}


def worker_health(slot: dict) -> dict:
    """A worker's own /health, with the secret the coordinator gave it (in its environment)."""
    environ = Path(f"/proc/{slot['pid']}/environ").read_bytes().split(b"\0")
    secret = next(v.split(b"=", 1)[1].decode() for v in environ
                  if v.startswith(b"WORKER_API_KEY="))
    return httpx.get(f"http://127.0.0.1:{slot['port']}/health",
                     headers={"Authorization": f"Bearer {secret}"}).json()


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def raw_switch(result: dict) -> float:
    """What the worker spends on a switch: both moves plus the generation itself."""
    return med(result["warm"]) + med(result["to_cpu"]) + med(result["to_device"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--switches", type=int, default=6)
    parser.add_argument("--width", type=int, default=256, help="UNet width (model size)")
    parser.add_argument("--before", type=Path, default=None,
                        help="another checkout whose CPU-tier switch to measure alongside")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = {m: build_tiny_sd_pipeline(root / f"pipe-{m}", width=args.width)
                 for m in ("A", "B")}
        size_mb = sum(f.stat().st_size for f in paths["A"].rglob("*") if f.is_file()) / 2**20
        tier = run(root / "tier", paths, args.switches, cpu_tier=True)
        before = (run(root / "before", paths, args.switches, cpu_tier=True,
                      checkout=args.before.resolve()) if args.before else None)
        cold = run(root / "cold", paths, args.switches, cpu_tier=False)
    raw = raw_switch(tier)
    print(f"A->B->A switching, {args.switches} switches each, pipelines of {size_mb:.0f} MB, "
          "CPU only (declared GPU), reclaim_sleep_s 2 (default); medians")
    print(f"{'measurement':<58}{'median s':>10}{'x raw':>8}")
    rows = [
        ("CPU-tier switch, observed (request -> image)", med(tier["switch"])),
        ("  raw: warm request + worker .to(cpu) + .to(device)", raw),
        ("    warm request to the resident model", med(tier["warm"])),
        ("    worker .to('cpu') of the evicted pipeline", med(tier["to_cpu"])),
        ("    worker .to(device) of the requested pipeline", med(tier["to_device"])),
        ("    coordinator offload (worker call + lease release)", med(tier["offload"])),
    ]
    if before is not None:
        rows += [
            (f"CPU-tier switch, observed, before ({args.before.name})", med(before["switch"])),
            ("  raw (before): warm + worker .to(cpu) + .to(device)", raw_switch(before)),
            ("    warm request (before)", med(before["warm"])),
        ]
    rows += [
        ("switch with stop + cold load from disk", med(cold["switch"])),
        ("  coordinator cold start of a worker", med(cold["cold_start"])),
        ("  worker raw from_pretrained", med(cold["from_pretrained"] + tier["from_pretrained"])),
    ]
    for name, value in rows:
        print(f"{name:<58}{value:>10.3f}{value / raw:>8.2f}")
    if before is not None:
        print(f"observed / raw, this code: {med(tier['switch']) / raw:.2f}; before: "
              f"{med(before['switch']) / raw_switch(before):.2f}")


if __name__ == "__main__":
    main()
