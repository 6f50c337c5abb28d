"""A→B→A switching between an embedder and a speech recogniser through the CPU-RAM tier, against
the raw moves their worker makes, and against stop-and-cold-load.

A MiniLM-sized random embedder (6 layers, hidden 384) and a random Wav2Vec2 recogniser (hidden
256, 6 layers) share a declared GPU that holds one. Each switch is one request for the model
that is parked in CPU RAM (an embedding of one sentence, or the transcript of a 2 s clip),
timed by the client. Its *cost* is the client time less a warm request to the same model in
the same run; it is set against the raw moves the worker reports (its ``.to('cpu')`` of the
evicted model plus ``.to(device)`` of the requested one). ``observed/raw`` is the whole switch
against the warm request + raw moves. A second run turns the CPU tier off
(``max_offloaded_mb: 0``): the evicted worker is stopped and the next switch starts a new one.

    .venv/bin/python benchmarks/transformers_swap.py [--switches 8]

On a CUDA machine the workers run on the GPU (``--device auto``) and their measured VRAM
replaces the manifests' figure after the first load, so the models must be large enough that
the declared GPU still holds only one: ``--hidden 1024 --layers 24 --gpu-mb 1800 --vram-mb
1400`` (about 1.2 and 0.9 GB of weights).
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
from benchmarks.harness import BenchServer, check_sides, coordinator_side
from tests.conftest import worker_health
from tests.transformers_fixtures import build_embedder, build_recogniser, speech_clip

SETTINGS = {"log_level": "WARNING", "use_nvml": False, "spare_workers": False}
WARM = 5


def call(server: BenchServer, model: str, clip: bytes) -> float:
    started = time.perf_counter()
    if model == "embed":
        answer = httpx.post(server.url + "/v1/embeddings", timeout=300,
                            json={"model": "embed", "input": "the cat sat on the mat"})
    else:
        answer = httpx.post(server.url + "/v1/audio/transcriptions", timeout=300,
                            files={"file": ("clip.wav", clip)}, data={"model": "ears"})
    elapsed = time.perf_counter() - started
    assert answer.status_code == 200, answer.text
    return elapsed


def run(workdir: Path, manifests: list[dict], switches: int, cpu_tier: bool,
        clip: bytes, gpu_mb: int) -> dict:
    gpu = [{"index": 0, "name": "declared", "vram_mb": gpu_mb}]
    config = dict(SETTINGS, gpus=gpu, **({} if cpu_tier else {"max_offloaded_mb": 0}))
    server = BenchServer(workdir, config, manifests)
    side = coordinator_side(server, switches=switches, warm_requests=WARM, clip_bytes=len(clip))
    server.start(timeout=120)
    switch: dict[str, list[float]] = {"embed": [], "ears": []}
    warm: dict[str, list[float]] = {"embed": [], "ears": []}
    try:
        order = ["embed", "ears"] * (switches // 2 + 1)
        for position, model in enumerate(order[:switches + 1]):
            took = call(server, model, clip)
            if position > 1:  # both loaded once: from here every request is a switch
                switch[model].append(took)
            if position >= 1:
                warm[model] += [call(server, model, clip) for _ in range(WARM)]
            if position == 0:
                slot = next(s for s in server.status()["slots"] if s["model"] == model)
                device = worker_health(slot)["device"]
        events = httpx.get(server.url + "/api/v1/events?stream=false").json()["events"]
    finally:
        server.stop()
    return {"side": side, "switch": switch, "warm": warm, "device": device,
            "to_cpu": [e["worker_seconds"] for e in events if e["type"] == "offloaded"],
            "to_device": [e["worker_seconds"] for e in events if e["type"] == "onloaded"],
            "cold": [e["seconds"] for e in events if e["type"] == "loaded"]}


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--switches", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=0,
                        help="both models' hidden size (default: embedder 384, recogniser 256)")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--gpu-mb", type=int, default=2048,
                        help="the declared GPU; on CUDA the models' measured VRAM is learned, "
                             "so size the models (--hidden, --layers) so that one fits, not two")
    parser.add_argument("--vram-mb", type=int, default=1200, help="each manifest's vram_mb")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        manifests = [
            {"id": "embed", "backend": "transformers", "category": "embedding",
             "path": str(build_embedder(root / "mini", hidden=args.hidden or 384,
                                        layers=args.layers)),
             "vram_mb": args.vram_mb},
            {"id": "ears", "backend": "transformers", "category": "stt",
             "path": str(build_recogniser(root / "ears", hidden=args.hidden or 256,
                                          layers=args.layers)),
             "vram_mb": args.vram_mb}]
        clip = speech_clip(2, "wav")
        tier = run(root / "tier", manifests, args.switches, True, clip, args.gpu_mb)
        cold = run(root / "cold", manifests, args.switches, False, clip, args.gpu_mb)
    check_sides({"CPU tier": tier["side"], "CPU tier off": cold["side"]}, ["max_offloaded_mb"])
    if not tier["to_cpu"]:
        sys.exit("no model was moved to CPU RAM: the declared GPU held both (see --gpu-mb)")
    raw = med(tier["to_cpu"]) + med(tier["to_device"])
    print(f"\nembedder <-> recogniser switching, {args.switches} switches per run, worker "
          f"device {tier['device']} (a declared GPU of {args.gpu_mb} MB holds one of them), no "
          "spare worker; medians, seconds\n")
    print("| model asked for | warm request | CPU-tier switch | switch cost | raw moves | "
          "observed/raw | stop + cold load |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for model in ("embed", "ears"):
        w, s = med(tier["warm"][model]), med(tier["switch"][model])
        c = med(cold["switch"][model])
        print(f"| {model} | {w:.3f} | {s:.3f} | {s - w:.3f} | {raw:.3f} | "
              f"{s / (w + raw):.2f}× | {c:.3f} |")
    print(f"\nraw moves: worker .to('cpu') {med(tier['to_cpu']):.4f}, .to(device) "
          f"{med(tier['to_device']):.4f}; a cold worker start (coordinator's load) "
          f"{med(cold['cold']):.3f}")


if __name__ == "__main__":
    main()
