"""Diffusion cold start: with and without the spare worker and the worker template, against a
warm-interpreter ``from_pretrained`` of the same pipeline, in one run.

- warm ``from_pretrained``: this process, torch and diffusers imported and the pipeline loaded
  once already, loads it again (the floor a worker process could reach);
- cold start without a spare or a template (``spare_workers: false``, ``worker_templates:
  false``): a new worker process (interpreter, imports, ``from_pretrained``) per load;
- cold start from the template (``spare_workers: false``): a worker forked from the template
  (imports done once, at the first load) per load;
- cold start with the spare (``spare_workers: true``): the load goes to the pre-started worker
  (imports done); between loads the benchmark waits until the replacement spare is ready, the
  steady state the spare is for.

Each cold start is one image request (64×64, 1 step) to an unloaded model; the table shows the
coordinator's load time (``loaded`` event: load start to READY) and the request's time to the
image, then the model is unloaded for the next round. Also: the spare's RSS and how long it
takes to become ready.

    .venv/bin/python benchmarks/cold_start.py [--rounds 3] [--width 256]
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
    wait_for,
    worker_health,
)
from tests.diffusion_fixtures import build_tiny_sd_pipeline

GPU = {"gpus": [{"index": 0, "name": "sim-8g", "vram_mb": 8192}], "log_level": "WARNING"}
IMAGE = {"model": "sd", "prompt": "x", "size": "64x64", "x_steps": 1, "x_seed": 1}


def warm_from_pretrained(path: Path, rounds: int) -> list[float]:
    from diffusers import DiffusionPipeline

    DiffusionPipeline.from_pretrained(str(path))  # imports and first-use costs paid here
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        DiffusionPipeline.from_pretrained(str(path)).set_progress_bar_config(disable=True)
        times.append(time.perf_counter() - started)
    return times


def ready_spare(server: BenchServer) -> dict | None:
    return next((s for s in server.status()["spare_workers"] if s.get("ready")), None)


def cold_starts(workdir: Path, path: Path, rounds: int, spare: bool, template: bool) -> dict:
    manifest = {"id": "sd", "category": "diffusion", "backend": "diffusers", "path": str(path),
                "vram_mb": 3000}
    server = BenchServer(workdir, dict(GPU, spare_workers=spare, worker_templates=template),
                         [manifest])
    side = coordinator_side(server, loads=rounds, request=IMAGE)
    server.start()
    requests, spares, worker_loads, templates = [], [], [], []
    try:
        for _ in range(rounds):
            if spare:
                ready = wait_for(lambda: ready_spare(server), timeout=300)
                assert ready, server.log()
                spares.append(ready)
            started = time.perf_counter()
            reply = httpx.post(server.url + "/v1/images/generations", json=IMAGE, timeout=600)
            requests.append(time.perf_counter() - started)
            assert reply.status_code == 200, reply.text
            status = server.status()
            [slot] = status["slots"]
            worker_loads.append(worker_health(slot)["load_s"])
            templates = [_rss_mb(t["pid"]) for t in status["worker_templates"] if t.get("pid")]
            unloaded = httpx.post(server.url + "/api/v1/models/sd/unload", timeout=60)
            assert unloaded.status_code == 200, unloaded.text
        events = httpx.get(server.url + "/api/v1/events?stream=false").json()["events"]
    finally:
        server.stop()
    return {"side": side, "loaded": [e["seconds"] for e in events if e["type"] == "loaded"],
            "request": requests, "worker_load": worker_loads,
            "used": sum(e["type"] == "spare_taken" for e in events),
            "spare_ready": [e["seconds"] for e in events if e["type"] == "spare_ready"],
            "spare_rss": [s["rss_mb"] for s in spares if s.get("rss_mb")],
            "template_rss": templates}


def _rss_mb(pid: int) -> float:
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.Error:
        return float("nan")


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=int, default=256, help="UNet width (model size)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = build_tiny_sd_pipeline(root / "pipe", width=args.width)
        size_mb = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20
        warm = med(warm_from_pretrained(path, args.rounds * 2))
        cold = cold_starts(root / "cold", path, args.rounds, spare=False, template=False)
        forked = cold_starts(root / "forked", path, args.rounds, spare=False, template=True)
        spare = cold_starts(root / "spare", path, args.rounds, spare=True, template=True)
    sides = {"warm from_pretrained": {"loader": "this process, imports done",
                                      "sd.path": str(path), "loads": args.rounds * 2},
             "cold, no spare": cold["side"], "cold, template": forked["side"],
             "cold, spare": spare["side"]}
    print("sides compared (the warm load runs in this process; the cold ones differ only in "
          "spare_workers and worker_templates):")
    print_sides(sides, sep="=")
    same_except({"warm": {"pipeline": str(path)}, "cold": {"pipeline": cold["side"]["sd.path"]},
                 "forked": {"pipeline": forked["side"]["sd.path"]},
                 "spare": {"pipeline": spare["side"]["sd.path"]}})
    same_except({"cold, no spare": cold["side"], "cold, template": forked["side"],
                 "cold, spare": spare["side"]}, ["spare_workers", "worker_templates"])
    assert spare["used"] == args.rounds, f"the spare took {spare['used']} of {args.rounds} loads"
    print(f"diffusion cold start, pipeline of {size_mb:.0f} MB, CPU only (declared GPU), "
          f"{args.rounds} loads each; medians")
    print(f"{'measurement':<52}{'median s':>10}{'x warm':>9}")
    rows = [
        ("warm-interpreter from_pretrained (same pipeline)", warm),
        ("cold load, no spare, no template (load -> READY)", med(cold["loaded"])),
        ("  of which the worker's own from_pretrained", med(cold["worker_load"])),
        ("cold load forked from the template (load -> READY)", med(forked["loaded"][1:])),
        ("  of which the worker's own from_pretrained", med(forked["worker_load"][1:])),
        ("  the first load (the template's imports too)", forked["loaded"][0]),
        ("cold load with the spare (load start -> READY)", med(spare["loaded"])),
        ("  of which the worker's own from_pretrained", med(spare["worker_load"])),
        ("first image, no spare, no template (request -> image)", med(cold["request"])),
        ("first image forked from the template", med(forked["request"][1:])),
        ("first image with the spare (request -> image)", med(spare["request"])),
        ("spare start until ready (interpreter + imports)", med(spare["spare_ready"])),
    ]
    for name, value in rows:
        print(f"{name:<52}{value:>10.3f}{value / warm:>9.2f}")
    print(f"{'spare worker RSS (MB), no model':<52}{med(spare['spare_rss']):>10.0f}")
    print(f"{'template RSS (MB)':<52}{med(forked['template_rss']):>10.0f}")


if __name__ == "__main__":
    main()
