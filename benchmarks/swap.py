"""A→B→A model switching: the CPU-RAM tier against stop-and-cold-load, in one run.

Two random-weight diffusion pipelines (a few hundred MB each) share a declared GPU that holds
one. Each switch is one image request (64×64, 1 step) for the model that is not resident.
Run once with the CPU tier on (the evicted pipeline is parked in RAM and onloaded into the same
worker) and once with it off (``max_offloaded_mb: 0``: the evicted worker is stopped and the
next switch starts a new one from disk). Next to them: the worker's raw ``from_pretrained``
time and its raw ``.to()`` times, as the worker reports them.

    .venv/bin/python benchmarks/swap.py [--switches 6] [--width 256]
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

GPU = {"gpus": [{"index": 0, "name": "sim-4g", "vram_mb": 4096}], "log_level": "WARNING"}


def manifest(model_id: str, path: Path) -> dict:
    return {"id": model_id, "category": "diffusion", "backend": "diffusers",
            "path": str(path), "vram_mb": 3000}


def run(workdir: Path, paths: dict[str, Path], switches: int, cpu_tier: bool) -> dict:
    config = dict(GPU, **({} if cpu_tier else {"max_offloaded_mb": 0}))
    server = ServerProcess(workdir, config, [manifest(m, p) for m, p in paths.items()]).start()
    times, loads, to_device, to_cpu = [], [], [], []
    try:
        order = ["A", "B"] * (switches // 2 + 1)
        for position, model in enumerate(order[:switches + 1]):
            started = time.perf_counter()
            response = httpx.post(server.url + "/v1/images/generations", timeout=600, json={
                "model": model, "prompt": "x", "size": "64x64", "x_steps": 1, "x_seed": 1})
            elapsed = time.perf_counter() - started
            assert response.status_code == 200, response.text
            if position > 0:  # the first request is a plain cold start, not a switch
                times.append(elapsed)
        events = httpx.get(server.url + "/api/v1/events?stream=false").json()["events"]
        for slot in server.status()["slots"]:
            if slot["port"]:
                health = httpx.get(f"http://127.0.0.1:{slot['port']}/health").json()
                loads.append(health["load_s"])
        to_cpu = [e["seconds"] for e in events if e["type"] == "offloaded"]
        to_device = [e["worker_seconds"] for e in events if e["type"] == "onloaded"]
        cold = [e["seconds"] for e in events if e["type"] == "loaded"]
    finally:
        server.stop()
    return {"switch": times, "from_pretrained": loads, "to_cpu": to_cpu,
            "to_device": to_device, "cold_start": cold}


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--switches", type=int, default=6)
    parser.add_argument("--width", type=int, default=256, help="UNet width (model size)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = {m: build_tiny_sd_pipeline(root / f"pipe-{m}", width=args.width)
                 for m in ("A", "B")}
        size_mb = sum(f.stat().st_size for f in paths["A"].rglob("*") if f.is_file()) / 2**20
        tier = run(root / "tier", paths, args.switches, cpu_tier=True)
        cold = run(root / "cold", paths, args.switches, cpu_tier=False)
    base = med(cold["switch"])
    print(f"A->B->A switching, {args.switches} switches each, pipelines of {size_mb:.0f} MB, "
          "CPU only (declared GPU); medians")
    print(f"{'measurement':<52}{'median s':>10}{'x cold':>9}")
    rows = [
        ("switch with the CPU-RAM tier (onload same worker)", med(tier["switch"])),
        ("switch with stop + cold load from disk", base),
        ("  coordinator cold start of a worker", med(cold["cold_start"])),
        ("  worker raw from_pretrained", med(cold["from_pretrained"] + tier["from_pretrained"])),
        ("  worker raw .to(device) on onload", med(tier["to_device"])),
        ("  coordinator offload (.to('cpu') + release lease)", med(tier["to_cpu"])),
    ]
    for name, value in rows:
        print(f"{name:<52}{value:>10.3f}{value / base:>9.2f}")


if __name__ == "__main__":
    main()
