"""An edit on a warm text-to-image model against a generation of the same size and steps, and
a video job's first progress against the moment its work starts.

Edits: a random-weight Stable Diffusion (``--width 256`` gives a UNet of some 100 MB, enough
that the denoising, not HTTP, is what is timed) is loaded once; then generations and edits
(image-to-image at strength 1.0, so both run every step) of one size and step count take
turns, ``--rounds`` of each, timed by the client; the table gives their medians and the
ratio. The lease table and the worker's loads from disk are read before the first edit and
after the last: an edit adds neither a lease nor a load.

Video: a tiny random-weight Wan pipeline, warm; each job is polled every 10 ms; the table
gives the time from the job's ``running`` (its slot granted) to the first poll that shows a
denoising step, and from submission to that step.

    .venv/bin/python benchmarks/media_edits.py [--rounds 7] [--width 256] [--size 256]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.harness import BenchServer
from tests.conftest import worker_health
from tests.diffusion_fixtures import build_tiny_sd_pipeline
from tests.video_fixtures import build_tiny_video_pipeline

SETTINGS = {"log_level": "WARNING", "use_nvml": False, "spare_workers": False,
            "gpus": [{"index": 0, "name": "sim-8g", "vram_mb": 8192}]}


def picture(side: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.radial_gradient("L").convert("RGB").resize((side, side)).save(buffer, format="PNG")
    return buffer.getvalue()


def timed(call) -> float:
    started = time.perf_counter()
    answer = call()
    elapsed = time.perf_counter() - started
    assert answer.status_code == 200, answer.text
    return elapsed


def edits(server: BenchServer, rounds: int, size: int, steps: int) -> dict:
    body = {"model": "sd", "prompt": "a lighthouse", "size": f"{size}x{size}",
            "x_steps": steps, "x_seed": 1}
    image = picture(size)

    def generate():
        return httpx.post(server.url + "/v1/images/generations", json=body, timeout=600)

    def edit():
        return httpx.post(server.url + "/v1/images/edits", timeout=600,
                          files={"image": ("in.png", image, "image/png")},
                          data={"model": "sd", "prompt": "a lighthouse", "size": body["size"],
                                "steps": str(steps), "seed": "1", "strength": "1.0"})

    timed(generate)  # load and warm
    timed(edit)  # the edit pipelines are made at the first edit of each kind
    leases = held(server)
    loads = worker_health(slot(server, "sd"))["loads_from_disk"]
    made, edited = [], []
    for _ in range(rounds):  # turns, so a noisy moment hits both sides
        made.append(timed(generate))
        edited.append(timed(edit))
    return {"generation_s": statistics.median(made), "edit_s": statistics.median(edited),
            "leases_same": held(server) == leases, "loads_before": loads,
            "loads_after": worker_health(slot(server, "sd"))["loads_from_disk"],
            "leases": sorted(leases)}


def held(server: BenchServer) -> set[tuple[str, str, int]]:
    """The leases held: id, holder, MB (their expiry moves with each renewal)."""
    leases = httpx.get(server.url + "/api/v1/leases", timeout=10).json()["leases"]
    return {(lease["id"], lease["holder"], lease["vram_mb"]) for lease in leases}


def slot(server: BenchServer, model: str) -> dict:
    return next(s for s in server.status()["slots"] if s["model"] == model)


def first_progress(server: BenchServer, rounds: int) -> dict:
    body = {"model": "wan", "prompt": "waves", "seconds": 1, "size": "64x64", "steps": 40,
            "guidance": 1}
    started_to_step, submit_to_step = [], []
    for _ in range(rounds + 1):
        submitted = time.perf_counter()
        video = httpx.post(server.url + "/v1/videos", json=body, timeout=60).json()
        job_id = video["id"].removeprefix("video_")
        running_at = None
        while True:
            job = httpx.get(f"{server.url}/api/v1/jobs/{job_id}").json()
            now = time.perf_counter()
            if job["status"] == "running" and running_at is None:
                running_at = now
            if job["progress"].get("step"):
                break
            assert job["status"] not in ("failed", "cancelled", "succeeded"), job
            time.sleep(0.01)
        httpx.delete(f"{server.url}/v1/videos/{video['id']}")
        if running_at is None:
            running_at = now
        started_to_step.append(now - running_at)
        submit_to_step.append(now - submitted)
    # the first job loads the model: left out
    return {"running_to_step_s": statistics.median(started_to_step[1:]),
            "submit_to_step_s": statistics.median(submit_to_step[1:]),
            "worst_running_to_step_s": max(started_to_step[1:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--width", type=int, default=256, help="UNet width of the test model")
    parser.add_argument("--size", type=int, default=256, help="picture side")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sd = build_tiny_sd_pipeline(root / "sd", width=args.width)
        wan = build_tiny_video_pipeline(root / "wan")
        manifests = [{"id": "sd", "category": "diffusion", "backend": "diffusers",
                      "path": str(sd), "vram_mb": 3000},
                     {"id": "wan", "backend": "diffusers", "path": str(wan), "vram_mb": 3000,
                      "fps": 8}]
        server = BenchServer(root / "server", SETTINGS, manifests).start()
        try:
            edit = edits(server, args.rounds, args.size, args.steps)
            video = first_progress(server, args.rounds)
        finally:
            server.stop()
    print(f"edit vs generation, {args.size}x{args.size}, {args.steps} steps, UNet width "
          f"{args.width}, {args.rounds} turns each (medians)")
    print("| request | median s | ratio |")
    print("| --- | --- | --- |")
    print(f"| generation | {edit['generation_s']:.3f} | 1.00 |")
    print(f"| edit (image-to-image, strength 1.0) | {edit['edit_s']:.3f} | "
          f"{edit['edit_s'] / edit['generation_s']:.2f} |")
    print(f"leases unchanged by the edits: {edit['leases_same']}; the worker's loads from disk "
          f"before {edit['loads_before']}, after {edit['loads_after']}")
    print(f"lease table (id, holder, MB), before and after: {edit['leases']}")
    print()
    print(f"video job, warm model: first denoising step seen (10 ms polls), {args.rounds} jobs")
    print("| from | median s | worst s |")
    print("| --- | --- | --- |")
    print(f"| the job's running (slot granted) | {video['running_to_step_s']:.3f} | "
          f"{video['worst_running_to_step_s']:.3f} |")
    print(f"| submission | {video['submit_to_step_s']:.3f} | |")


if __name__ == "__main__":
    main()
