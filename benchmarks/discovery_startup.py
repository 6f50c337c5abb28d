"""What a folder of 200 GGUF files costs a coordinator's start, next to an empty folder.

Writes 200 model files (real GGUF headers with a 49,152-entry vocabulary, as SmolLM2's, and
one small tensor each: the header is what discovery reads, the weights it never touches), then
in turns starts ``model-boss serve`` on the empty folder (the baseline) and on the full one,
timing the process start until ``/health`` answers and the catalog lists every file. Also
times discovery alone in this process (reading 200 headers). Prints one table of medians.

    .venv/bin/python benchmarks/discovery_startup.py [--files 200] [--rounds 5]
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
from tests.gguf_fixtures import write_gguf


def coordinator(workdir: Path, models: Path) -> BenchServer:
    return BenchServer(workdir, {"discover": True, "models_dir": str(models),
                                 "gpus": [{"index": 0, "name": "sim", "vram_mb": 8192}],
                                 "use_nvml": False}, [])


def start_seconds(workdir: Path, models: Path, expected: int) -> float:
    server = coordinator(workdir, models)
    started = time.perf_counter()
    server.start(timeout=60)
    try:
        listed = len(httpx.get(server.url + "/v1/models", timeout=10).json()["data"])
        took = time.perf_counter() - started
        if listed != expected:
            raise SystemExit(f"{models}: {listed} models listed, {expected} expected")
        return took
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=49_152)
    args = parser.parse_args()
    from model_boss.catalog.discovery import discover

    root = Path(tempfile.mkdtemp(prefix="discovery-bench-"))
    empty, full = root / "empty", root / "full"
    empty.mkdir()
    full.mkdir()
    for i in range(args.files):
        folder = full / f"org-{i % 20}"
        folder.mkdir(exist_ok=True)
        write_gguf(folder / f"model-{i:03}-Q4_K_M.gguf", context=8192, vocab=args.vocab,
                   blocks=30)
    size_mb = sum(p.stat().st_size for p in full.rglob("*.gguf")) / 2**20
    check_sides({name: coordinator_side(coordinator(root / "sides" / name, models),
                                        gguf_files=len(list(models.rglob("*.gguf"))))
                 for name, models in (("empty folder", empty), ("full folder", full))},
                ["models_dir", "gguf_files"])
    scans, baseline, with_files = [], [], []
    for round_ in range(args.rounds):
        started = time.perf_counter()
        found = discover(full, 4096)
        scans.append(time.perf_counter() - started)
        assert len(found) == args.files
        work = root / f"round-{round_}"
        baseline.append(start_seconds(work / "empty", empty, 0))
        with_files.append(start_seconds(work / "full", full, args.files))
    base, files = statistics.median(baseline), statistics.median(with_files)
    print(f"\nCoordinator start with {args.files} discovered GGUF files ({size_mb:.0f} MB of "
          f"headers, vocabulary {args.vocab}), median of {args.rounds} rounds in turns\n")
    print("| side | start to /health and a full /v1/models (s) | vs empty folder |")
    print("|---|---:|---:|")
    print(f"| empty models folder (baseline) | {base:.2f} | 1.00× |")
    print(f"| {args.files} files | {files:.2f} | {files / base:.2f}× |")
    print(f"\ndiscovery alone (scan + {args.files} header reads, in process): "
          f"{statistics.median(scans) * 1000:.0f} ms median")


if __name__ == "__main__":
    main()
