"""A 30 s clip transcribed through model-boss, next to the same pipeline called directly on
the same file (the baseline).

Builds a random-weight Wav2Vec2 CTC recogniser (hidden 256, 6 layers) and serves it with
``backend: transformers``, ``category: stt``. In turns, each round: the baseline decodes the
file with PyAV and calls transformers' speech-recognition pipeline (word timestamps, as the
worker asks for them); model-boss gets the same file as a multipart upload to
``/v1/audio/transcriptions`` (``verbose_json`` with word timestamps). Prints one table of
medians (seconds per clip) and the ratio.

    .venv/bin/python benchmarks/speech_transcription.py [--rounds 9] [--seconds 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.harness import BenchServer, check_sides, coordinator_side
from tests.transformers_fixtures import build_recogniser, speech_clip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    import torch
    from transformers import pipeline

    from workers.transformers.audio import decode

    root = Path(tempfile.mkdtemp(prefix="stt-bench-"))
    model_dir = build_recogniser(root / "ears", hidden=256, layers=6)
    clip = speech_clip(args.seconds, "mp3")
    direct = pipeline("automatic-speech-recognition", model=str(model_dir), device="cpu")
    server = BenchServer(root / "server", {
        "gpus": [{"index": 0, "name": "sim", "vram_mb": 8192}], "use_nvml": False},
        [{"id": "ears", "backend": "transformers", "category": "stt", "path": str(model_dir),
          "vram_mb": 500}])
    mb = coordinator_side(server)
    clip_settings = {"clip": f"{args.seconds:g} s mp3", "clip_bytes": len(clip),
                     "timestamps": "word", "device": "cpu"}
    check_sides({  # each process's torch takes its thread count from OMP_NUM_THREADS
        "baseline": {"path": "PyAV decode + pipeline in this process", "model": str(model_dir),
                     **clip_settings,
                     "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset")},
        "model-boss": {"path": "/v1/audio/transcriptions verbose_json", "model": mb["ears.path"],
                       **clip_settings,
                       "OMP_NUM_THREADS": server.env.get("OMP_NUM_THREADS", "unset")}},
        ["path"], f"sides compared (torch threads here: {torch.get_num_threads()})")
    server.start(timeout=60)

    def through() -> float:
        started = time.perf_counter()
        answer = httpx.post(server.url + "/v1/audio/transcriptions", timeout=300,
                            files={"file": ("clip.mp3", clip)},
                            data={"model": "ears", "response_format": "verbose_json",
                                  "timestamp_granularities[]": "word"})
        answer.raise_for_status()
        return time.perf_counter() - started

    def baseline() -> float:
        started = time.perf_counter()
        samples = decode(clip, 16000)
        direct({"raw": samples, "sampling_rate": 16000}, return_timestamps="word")
        return time.perf_counter() - started

    try:
        through(), baseline()  # load and warm
        base, via = [], []
        for _ in range(args.rounds):
            base.append(baseline())
            via.append(through())
    finally:
        server.stop()
    b, v = statistics.median(base), statistics.median(via)
    print(f"\nA {args.seconds:g} s mp3 clip transcribed: model-boss vs the pipeline called "
          f"directly (PyAV decode + pipeline); random Wav2Vec2 (hidden 256, 6 layers), CPU, "
          f"median of {args.rounds} rounds in turns\n")
    print("| side | s per clip | x baseline |")
    print("|---|---:|---:|")
    print(f"| pipeline called directly (baseline) | {b:.3f} | 1.00× |")
    print(f"| model-boss `/v1/audio/transcriptions` | {v:.3f} | {v / b:.2f}× |")


if __name__ == "__main__":
    main()
