"""The first answer after a swap back, with the prompt cache kept across the swap and without.

Two models on the demo GGUF (SmolLM2-135M) share a declared GPU that holds one. Model A is
asked a question behind a long system prompt (about 1,900 tokens). Each round, in one run:

- swap back, cache kept: a request to B evicts A (its slot is saved), ``POST
  /api/v1/models/a/load`` loads A again (its slot restored), then the question to A is timed
  to its first streamed token;
- warm: the same question again to the loaded A (its slot holds the prefix);
- swap back, no cache: as the first, with A's saves cleared before its load (a full prefill,
  as every swap paid before);
- the same two swaps back with the load inside the request: no ``POST .../load`` first, the
  question to A itself loads it (worker start, restore or not, then the prompt), timed to its
  first streamed token, as a client that just asks sees it.

Prints one table of medians: time to first token of each, the ratio to the warm request, the
load of A (worker start + restore; in the request's own time where the request loads it) and
the save and restore times.

    .venv/bin/python benchmarks/prompt_cache_swap.py [--rounds 3] [--facts 130]
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
from benchmarks.harness import DEFAULT_THREADS, BenchServer, demo_manifest, print_sides


def first_token(server: BenchServer, messages: list[dict]) -> tuple[float, int]:
    """Seconds to the first streamed content, and the cached prompt tokens reported."""
    started = time.perf_counter()
    first = None
    cached = 0
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=600, json={
            "model": "a", "messages": messages, "max_tokens": 4, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}) as reply:
        for line in reply.iter_lines():
            if first is None and '"content":"' in line:
                first = time.perf_counter() - started
            if '"prompt_tokens_details"' in line:
                cached = int(line.split('"cached_tokens":')[1].split("}")[0].split(",")[0])
    assert first is not None
    return first, cached


def evict(server: BenchServer, clear: bool) -> None:
    """Evict A with a request to B (A's slot is saved); ``clear``: then remove A's saves."""
    httpx.post(server.url + "/v1/chat/completions", timeout=600, json={
        "model": "b", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    if clear:
        httpx.delete(server.url + "/api/v1/models/a/cache", timeout=60).raise_for_status()


def swap_back(server: BenchServer, clear: bool) -> float:
    """Evict A with a request to B, then load A again; the load's seconds."""
    evict(server, clear)
    started = time.perf_counter()
    httpx.post(server.url + "/api/v1/models/a/load", timeout=600).raise_for_status()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--facts", type=int, default=130, help="system prompt length")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    args = parser.parse_args()
    system = "You answer questions about numbers. " + " ".join(
        f"Fact {i}: after {i} comes {i + 1}." for i in range(args.facts))
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": "What comes after 7?"}]
    rows: dict[str, list[float]] = {"kept": [], "warm": [], "cold": [], "load_kept": [],
                                    "load_cold": [], "kept_in": [], "cold_in": []}
    cached: dict[str, list[int]] = {name: [] for name in ("kept", "warm", "cold", "kept_in",
                                                          "cold_in")}

    def timed(name: str) -> None:
        seconds, tokens = first_token(server, messages)
        rows[name].append(seconds)
        cached[name].append(tokens)
    with tempfile.TemporaryDirectory() as tmp:
        server = BenchServer(Path(tmp), {
            "log_level": "WARNING", "gpus": [{"index": 0, "name": "sim", "vram_mb": 1600}],
            "vram_margin_mb": 100, "prompt_cache_min_tokens": 256},
            [demo_manifest(m, threads=args.threads, ctx_size=4096, vram_mb=1000)
             for m in ("a", "b")]).start()
        try:
            first_token(server, messages)  # A holds the prefix
            for _ in range(args.rounds):
                rows["load_kept"].append(swap_back(server, clear=False))
                stats = httpx.get(server.url + "/api/v1/models/a/status",
                                  timeout=30).json()["prompt_cache"]
                timed("kept")
                timed("warm")
                evict(server, clear=False)
                timed("kept_in")  # the request loads A (restoring its slot) itself
                rows["load_cold"].append(swap_back(server, clear=True))
                timed("cold")
                evict(server, clear=True)
                timed("cold_in")
        finally:
            server.stop()
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"\nFirst token after a swap back, SmolLM2-135M on the CPU ({args.threads} threads), "
          f"a {max(cached['kept'])}-token cached prefix, median of {args.rounds} rounds\n")
    print("| request to A | time to first token, s | x warm | cached tokens | load of A, s |")
    print("|---|---:|---:|---:|---:|")
    print(f"| warm (loaded, prefix in its slot) | {med['warm']:.3f} | 1.00× | "
          f"{statistics.median(cached['warm']):.0f} | — |")
    print(f"| first after a swap back, cache kept | {med['kept']:.3f} | "
          f"{med['kept'] / med['warm']:.2f}× | {statistics.median(cached['kept']):.0f} | "
          f"{med['load_kept']:.3f} |")
    print(f"| first after a swap back, no cache (cold prefill) | {med['cold']:.3f} | "
          f"{med['cold'] / med['warm']:.2f}× | {statistics.median(cached['cold']):.0f} | "
          f"{med['load_cold']:.3f} |")
    for name, what in (("kept_in", "cache kept"), ("cold_in", "no cache")):
        print(f"| first after a swap back, {what}, load in the request | {med[name]:.3f} | "
              f"{med[name] / med['warm']:.2f}× | {statistics.median(cached[name]):.0f} | "
              "in the request |")
    print(f"\nsave of A's slot {stats.get('last_save_s')} s, restore "
          f"{stats.get('last_restore_s')} s (the last round's); {stats['files']} file of "
          f"{stats['mb']} MB on disk")
    print_sides({"kept": {"threads": args.threads, "ctx_size": 4096},
                 "cold": {"threads": args.threads, "ctx_size": 4096}})


if __name__ == "__main__":
    main()
