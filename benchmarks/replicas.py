"""Replicas: cache-aware routing against round robin, and a second replica under a burst.

1. Routing. One coordinator per side serves the demo GGUF (SmolLM2-135M) as ``smol`` on two
   declared GPUs, one llama.cpp thread per worker, one slot each (``parallel`` 1) with
   llama.cpp's host-RAM prompt cache on (its default): 16 conversations, each with its own
   system prompt of some 1,500 tokens, 4 turns each, interleaved (every conversation's turn
   ``t`` before any turn ``t + 1``; the order within a turn shuffled, the same on every side).
   Each turn streams 8 tokens at temperature 0; the client times the first token, and
   llama.cpp's own ``timings`` say how many prompt tokens came from its cache (``cache_n``)
   and how many it computed (``prompt_n``). Sides:

   - (a) ``replica_routing: cache`` with ``replicas: {min: 2, max: 2}``;
   - (b) ``replica_routing: round_robin``, the same two replicas;
   - (c) one replica (the cache hit rate's baseline: every conversation on one cache).

   Then the same across two members of a cluster on one Redis (a GPU and a copy each), the
   client sending turn ``t`` of conversation ``n`` to member ``(n + t) % 2``: (d) members
   forward by cached prefix (``replica_routing: cache``), (e) they do not (``round_robin``:
   a member serves what reaches it while the model is READY there).

2. Burst. One coordinator, the same model with ``replicas: {max: 1}`` then ``{max: 2}``
   (each side a fresh coordinator with the model loaded once): 12 chats of 48 tokens sent at
   once; the queue wait each one reports (``x-model-boss-queue-wait-s``), which replica
   served it, and when the second replica served its first request against its load time.

Each part prints one table, medians, with ratios against its baseline in the same run.

    .venv/bin/python benchmarks/replicas.py [--conversations 16] [--turns 4] [--part all]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.harness import BenchServer, check_sides, coordinator_side, demo_manifest

GPUS = [{"index": 0, "name": "sim-2g", "vram_mb": 2048},
        {"index": 1, "name": "sim-2g", "vram_mb": 2048}]
CTX_SIZE = 2560
MODEL_MB = 800


FACTS = 57  # some 1,500 tokens of the demo model's (``--facts`` for a quick look)


def system_prompt(n: int) -> str:
    """Conversation ``n``'s own ~1,500-token system prompt (no two share a first block)."""
    facts = " ".join(f"Fact {n}.{i}: in ledger {n}, line {i} holds {(i * 37 + n) % 101} "
                     f"units of item {i % 13}." for i in range(FACTS))
    return f"You are the clerk of ledger {n}. Answer in one short sentence. {facts}"


def stream_turn(url: str, messages: list[dict]) -> dict[str, Any]:
    """One streamed turn: first-token seconds, the answer, llama.cpp's timings, the
    replica."""
    started = time.perf_counter()
    first, text, timings = None, [], {}
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=600, json={
            "model": "smol", "messages": messages, "max_tokens": 8, "temperature": 0,
            "stream": True}) as response:
        assert response.status_code == 200, response.read()
        replica = response.headers.get("x-model-boss-member", "") + \
            response.headers.get("x-model-boss-replica", "smol")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter() - started
                    text.append(piece)
            timings = event.get("timings") or timings
    return {"ttft": first if first is not None else time.perf_counter() - started,
            "text": "".join(text), "cache_n": int(timings.get("cache_n", 0)),
            "prompt_n": int(timings.get("prompt_n", 0)), "replica": replica}


def ready_copies(url: str, at_least: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        slots = httpx.get(url + "/api/v1/status").json()["slots"]
        if sum(s["state"] == "ready" for s in slots) >= at_least:
            return
        time.sleep(0.2)
    raise SystemExit(f"{url}: fewer than {at_least} copies ready after 120 s")


def converse(urls: list[str], conversations: int, turns: int, seed: int) -> list[dict]:
    """The conversations, interleaved; turn ``t`` of conversation ``n`` sent to
    ``urls[(n + t) % len(urls)]`` (one coordinator, or a client spreading over members)."""
    history = [[{"role": "system", "content": system_prompt(n)}]
               for n in range(conversations)]
    rng = random.Random(seed)
    rows = []
    for turn in range(turns):
        order = list(range(conversations))
        rng.shuffle(order)
        for n in order:
            history[n].append({"role": "user", "content": f"Turn {turn}: how many units "
                                                          f"are on line {turn * 7 + n}?"})
            row = stream_turn(urls[(n + turn) % len(urls)], history[n])
            history[n].append({"role": "assistant", "content": row["text"]})
            rows.append({**row, "conversation": n, "turn": turn})
    return rows


def routing_side(root: Path, name: str, routing: str, replicas: dict, conversations: int,
                 turns: int, seed: int) -> tuple[dict, list[dict]]:
    manifest = demo_manifest("smol", threads=1, ctx_size=CTX_SIZE, vram_mb=MODEL_MB,
                             replicas=replicas)
    server = BenchServer(root / name, {"log_level": "WARNING", "gpus": GPUS,
                                       "replica_routing": routing,
                                       "prompt_cache_mb": 0}, [manifest]).start()
    try:
        # the replicas loaded before the clock starts (min: 2 starts both when wanted)
        stream_turn(server.url, [{"role": "user", "content": "hi"}])
        ready_copies(server.url, replicas["min"])
        return coordinator_side(server), converse([server.url], conversations, turns, seed)
    finally:
        server.stop()


def cluster_side(root: Path, name: str, routing: str, conversations: int, turns: int,
                 seed: int) -> tuple[dict, list[dict]]:
    """Two members on one Redis, a GPU and a copy each; the client alternates between them."""
    from tests.conftest import RedisServer

    redis = RedisServer(root).start()
    members = [BenchServer(root / f"{name}-{host}", {
        "log_level": "WARNING", "gpus": GPUS[:1], "replica_routing": routing,
        "prompt_cache_mb": 0, "redis_url": redis.url, "cluster": True, "host_id": host,
        "cluster_secret": "bench-secret"},
        [demo_manifest("smol", threads=1, ctx_size=CTX_SIZE, vram_mb=MODEL_MB)])
        for host in "ab"]
    try:
        for member in members:
            member.start(60)
        for member in members:
            httpx.post(member.url + "/api/v1/models/smol/load", timeout=120)
            ready_copies(member.url, 1)
        time.sleep(2)  # each member's record seen by the other
        return coordinator_side(members[0]), converse([m.url for m in members],
                                                      conversations, turns, seed)
    finally:
        for member in members:
            member.stop()
        redis.stop()


def table(title: str, results: dict[str, list[dict]], baseline: str,
          conversations: int) -> None:
    base = statistics.median(r["ttft"] for r in results[baseline])
    print(f"\n{title}")
    print(f"{'side':<22} {'p50 TTFT s':>10} {'p90 TTFT s':>10} {'vs ' + baseline[:3]:>7} "
          f"{'hit rate':>9} {'misses':>7} {'served by':>10} {'one place':>9}")
    for label, rows in results.items():
        ttfts = sorted(r["ttft"] for r in rows)
        p50 = statistics.median(ttfts)
        p90 = ttfts[int(0.9 * (len(ttfts) - 1))]
        cached = sum(r["cache_n"] for r in rows)
        total = cached + sum(r["prompt_n"] for r in rows)
        misses = sum(1 for r in rows if r["prompt_n"] > 500)  # a system prompt computed
        places = len({r["replica"] for r in rows})
        stuck = sum(len({r["replica"] for r in rows if r["conversation"] == n}) == 1
                    for n in range(conversations))
        print(f"{label:<22} {p50:>10.3f} {p90:>10.3f} {p50 / base:>6.2f}x "
              f"{cached / max(1, total):>8.1%} {misses:>7} {places:>10} "
              f"{stuck:>6}/{conversations}")
    print("(hit rate: prompt tokens llama.cpp took from its cache over all prompt tokens; "
          "misses: turns that computed their system prompt; one place: conversations whose "
          "turns all ran on one copy)")


def routing(root: Path, conversations: int, turns: int, seed: int) -> None:
    plans = (("(a) cache-aware", "cache", {"min": 2, "max": 2}),
             ("(b) round robin", "round_robin", {"min": 2, "max": 2}),
             ("(c) one replica", "cache", {"min": 1, "max": 1}))
    sides, results = {}, {}
    for label, policy, replicas in plans:
        print(f"{label}: {conversations} conversations x {turns} turns ...", flush=True)
        sides[label], results[label] = routing_side(root, label[1], policy, replicas,
                                                    conversations, turns, seed)
    check_sides(sides, measured=("replica_routing", "smol.replicas"))
    table(f"Routing on one host: {conversations} conversations x {turns} turns, ~1,500-token "
          f"system prompts, 2 declared GPUs, 1 llama.cpp thread per copy", results,
          "(b) round robin", conversations)


def across_members(root: Path, conversations: int, turns: int, seed: int) -> None:
    sides, results = {}, {}
    for label, policy in (("(d) members, cache", "cache"),
                          ("(e) members, no cache", "round_robin")):
        print(f"{label}: {conversations} conversations x {turns} turns ...", flush=True)
        sides[label], results[label] = cluster_side(root, label[1], policy, conversations,
                                                    turns, seed)
    check_sides(sides, measured=("replica_routing", "redis_url"))
    table(f"Across two members on one Redis (a GPU and a copy each; the client alternates "
          f"members turn by turn): {conversations} conversations x {turns} turns", results,
          "(e) members, no cache", conversations)


def fire(server: BenchServer, requests: int, started: float) -> list[dict]:
    """``requests`` chats of 48 tokens sent at once: each one's queue wait, replica and
    when it was done."""
    rows: list[dict] = []

    def ask(i: int) -> None:
        reply = httpx.post(server.url + "/v1/chat/completions", timeout=600, json={
            "model": "smol", "max_tokens": 48, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"Count from {i} upwards."}]})
        assert reply.status_code == 200, reply.text
        rows.append({"wait": float(reply.headers["x-model-boss-queue-wait-s"]),
                     "replica": reply.headers.get("x-model-boss-replica", "smol"),
                     "done": time.perf_counter() - started})

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return rows


def burst(root: Path, requests: int) -> None:
    results, sides = {}, {}
    for label, high in (("(a) one replica", 1), ("(b) up to two", 2)):
        manifest = demo_manifest("smol", threads=1, ctx_size=1024, vram_mb=MODEL_MB,
                                 replicas={"min": 1, "max": high})
        server = BenchServer(root / f"burst{high}", {
            "log_level": "WARNING", "gpus": GPUS, "replica_scale_wait_s": 1.0},
            [manifest]).start()
        try:
            httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
                "model": "smol", "max_tokens": 1, "messages": [{"role": "user",
                                                               "content": "hi"}]})
            sides[label] = coordinator_side(server)
            started = time.perf_counter()
            rows = fire(server, requests, started)
            total = time.perf_counter() - started
            events = httpx.get(server.url + "/api/v1/events?stream=false").json()["events"]
            slots = httpx.get(server.url + "/api/v1/status").json()["slots"]
            second = next((s for s in slots if s["replica"] == 2), None)
            results[label] = (rows, total, events, second)
        finally:
            server.stop()
    check_sides(sides, measured=("smol.replicas",))
    base = statistics.median(r["wait"] for r in results["(a) one replica"][0])
    print(f"\nBurst: {requests} chats of 48 tokens at once, 2 declared GPUs, 1 thread per "
          f"worker")
    print(f"{'side':<16} {'wait p50 s':>10} {'vs (a)':>7} {'all done s':>10} "
          f"{'served by #2':>12} {'#2 load s':>9} {'#2 first answer s':>17}")
    for label, (rows, total, events, second) in results.items():
        wait = statistics.median(r["wait"] for r in rows)
        by_two = [r for r in rows if r["replica"].endswith("#2")]
        load = second["last_load_s"] if second else None
        first = min((r["done"] for r in by_two), default=None)
        print(f"{label:<16} {wait:>10.3f} {wait / base:>6.2f}x {total:>10.2f} "
              f"{len(by_two):>12} {'-' if load is None else f'{load:.2f}':>9} "
              f"{'-' if first is None else f'{first:.2f}':>17}")
        added = [e for e in events if e["type"] == "replica_added"]
        if added:
            print(f"  replica_added after the first waiter waited {added[0]['waited_s']} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--burst", type=int, default=12)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--facts", type=int, default=57)
    parser.add_argument("--part", choices=("routing", "cluster", "burst", "all"),
                        default="all")
    args = parser.parse_args()
    global FACTS
    FACTS = args.facts
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        if args.part in ("routing", "all"):
            routing(root, args.conversations, args.turns, args.seed)
        if args.part in ("cluster", "all"):
            across_members(root, args.conversations, args.turns, args.seed)
        if args.part in ("burst", "all"):
            burst(root, args.burst)


if __name__ == "__main__":
    main()
