"""32 clients each embedding one sentence through model-boss, next to the same model's
``encode()`` on the same 32 sentences in one process (the baseline).

Builds a MiniLM-sized embedder with random weights (BERT, 6 layers, hidden 384, mean pooling;
sentence-transformers folder), serves it with ``backend: transformers`` (dynamic batching:
``batch_size`` 32, ``max_batch_wait_ms`` 5 or ``--wait-ms``) and, in turns: the baseline
encodes the 32 sentences in one call; model-boss gets them as 32 concurrent requests of one
sentence each, one connection each (like a load generator, through model-boss's own lean HTTP
client on uvloop; ``--client httpx`` for httpx). ``--threads N`` gives both sides N torch
threads (default: torch's own, the number of cores). Each side starts ``--gap-ms`` after the
other ends, once the other's idle torch threads have stopped spinning (GNU OpenMP's default
spin is about 10 ms here), so neither side runs beside the other's spinning threads.
Prints one table of medians (sentences per second) and the ratio, and the worker's batches.

    .venv/bin/python benchmarks/embeddings_batching.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.harness import BenchServer, check_sides, coordinator_side
from model_boss.backends.http_link import HttpLink
from tests.conftest import worker_env, worker_health
from tests.transformers_fixtures import WORDS, build_embedder

CLIENTS = 32
CLIENT = "lean"  # --client


def sentences(round_: int) -> list[str]:
    return [" ".join(WORDS[(round_ * 7 + i * 3 + j) % len(WORDS)] for j in range(12))
            for i in range(CLIENTS)]


async def through(url: str, texts: list[str]) -> float:
    """The 32 requests at once, one connection each; seconds until the last answer."""
    if CLIENT == "httpx":
        async with httpx.AsyncClient(timeout=120) as client:
            started = time.perf_counter()
            answers = await asyncio.gather(*(
                client.post(url + "/v1/embeddings", json={"model": "mini", "input": text})
                for text in texts))
            took = time.perf_counter() - started
        for answer in answers:
            answer.raise_for_status()
        return took
    link = HttpLink(url, timeout_s=120, max_idle=0)  # nothing pooled: 32 clients
    started = time.perf_counter()
    replies = await asyncio.gather(*(
        link.post("/v1/embeddings", orjson.dumps({"model": "mini", "input": text}),
                  {"content-type": "application/json"}, stream=False) for text in texts))
    took = time.perf_counter() - started
    assert all(reply.status == 200 for reply in replies), [r.status for r in replies]
    return took


def run(work: Coroutine[Any, Any, float]) -> float:
    """On uvloop (as the coordinator) for the lean client, asyncio's own loop for httpx."""
    return uvloop.run(work) if CLIENT == "lean" else asyncio.run(work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--wait-ms", type=float, default=5.0,
                        help="the model's max_batch_wait_ms (its default: 5)")
    parser.add_argument("--client", choices=["lean", "httpx"], default="lean",
                        help="the clients' HTTP library (lean: model-boss's httptools client)")
    parser.add_argument("--gap-ms", type=float, default=100.0,
                        help="the pause before each side's turn (default: 100)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads on both sides (OMP_NUM_THREADS; default: torch's)")
    args = parser.parse_args()
    if args.threads:  # before torch is imported, here and in the coordinator's environment
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    global CLIENT
    CLIENT = args.client
    from sentence_transformers import SentenceTransformer

    root = Path(tempfile.mkdtemp(prefix="embed-bench-"))
    model_dir = build_embedder(root / "mini", hidden=384, layers=6)
    direct = SentenceTransformer(str(model_dir), device="cpu")
    server = BenchServer(root / "server", {
        "gpus": [{"index": 0, "name": "sim", "vram_mb": 8192}], "use_nvml": False},
        [{"id": "mini", "backend": "transformers", "category": "embedding",
          "path": str(model_dir), "vram_mb": 500, "batch_size": CLIENTS,
          "max_batch_wait_ms": args.wait_ms}])
    import torch

    mb = coordinator_side(server)
    server.start(timeout=60)
    try:
        run(through(server.url, sentences(0)))  # load and warm
        direct.encode(sentences(0), batch_size=CLIENTS)
        slot = next(s for s in server.status()["slots"] if s["model"] == "mini")
        started_with = worker_env(slot["pid"])
        check_sides({  # each process's torch takes its thread count from OMP_NUM_THREADS
            "baseline": {"path": "one encode() in this process", "model": str(model_dir),
                         "batch_size": CLIENTS, "sentences": CLIENTS, "device": "cpu",
                         "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset"),
                         "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "unset"),
                         "GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT", "unset")},
            "model-boss": {"path": f"{CLIENTS} concurrent requests, dynamic batching "
                                   f"(max_batch_wait_ms {mb['mini.max_batch_wait_ms']})",
                           "model": mb["mini.path"], "batch_size": mb["mini.batch_size"],
                           "sentences": CLIENTS, "device": "cpu",
                           "OMP_NUM_THREADS": started_with.get("OMP_NUM_THREADS", "unset"),
                           "OMP_WAIT_POLICY": started_with.get("OMP_WAIT_POLICY", "unset"),
                           "GOMP_SPINCOUNT": started_with.get("GOMP_SPINCOUNT", "unset")}},
            ["path", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"],
            f"sides compared (torch threads here: {torch.get_num_threads()})")
        baseline, via = [], []
        for round_ in range(1, args.rounds + 1):
            texts = sentences(round_)
            time.sleep(args.gap_ms / 1000)
            started = time.perf_counter()
            direct.encode(texts, batch_size=CLIENTS, show_progress_bar=False)
            baseline.append(CLIENTS / (time.perf_counter() - started))
            time.sleep(args.gap_ms / 1000)
            via.append(CLIENTS / run(through(server.url, texts)))
        slot = next(s for s in server.status()["slots"] if s["model"] == "mini")
        health = worker_health(slot)
    finally:
        server.stop()
    base, served = statistics.median(baseline), statistics.median(via)
    print(f"\n{CLIENTS} single-sentence embedding requests at once vs one encode() of the "
          f"{CLIENTS} sentences; MiniLM-sized random BERT (6 layers, hidden 384), CPU, "
          f"{torch.get_num_threads()} torch threads a side, median of {args.rounds} rounds "
          f"in turns, the {CLIENT} client\n")
    print("| side | sentences/s | x baseline |")
    print("|---|---:|---:|")
    print(f"| encode() in one process (baseline) | {base:.0f} | 1.00× |")
    print(f"| model-boss, {CLIENTS} concurrent requests | {served:.0f} | {served / base:.2f}× |")
    print(f"\nworker batches: {health.get('batches')}, largest {health.get('largest_batch')}")


if __name__ == "__main__":
    main()
