"""What Anthropic's ``/v1/messages`` costs through model-boss, next to what the OpenAI route
costs, each against the same llama.cpp worker called directly (the baseline).

Starts a coordinator (declared GPU, embedded store) serving SmolLM2-135M, warms it, then
times the same short answer (8 tokens, greedy) on four sides taken in turns, whole and
streamed: ``/v1/chat/completions`` and ``/v1/messages``, each through model-boss and straight
to the worker's port. Prints one table of medians: each route's overhead over its own direct
call, and the ratio of the two overheads.

    .venv/bin/python benchmarks/messages_overhead.py [--requests 40]
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
    DEFAULT_THREADS,
    BenchServer,
    check_sides,
    demo_manifest,
    llama_flags,
    same_except,
    worker_argv,
    worker_process,
)

PROMPT = [{"role": "user", "content": "Say hello."}]
BODIES = {"/v1/chat/completions": {"messages": PROMPT, "max_tokens": 8, "temperature": 0},
          "/v1/messages": {"messages": PROMPT, "max_tokens": 8, "temperature": 0, "top_k": 1}}


def timed(http: httpx.Client, path: str, stream: bool) -> float:
    body = {"model": "smol", **BODIES[path], "stream": stream}
    started = time.perf_counter()
    if stream:
        with http.stream("POST", path, json=body) as answer:
            answer.raise_for_status()
            for _ in answer.iter_raw():
                pass
    else:
        http.post(path, json=body).raise_for_status()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=40, help="requests per side")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = BenchServer(Path(tmp), {"log_level": "WARNING"},
                             [demo_manifest("smol", threads=args.threads, ctx_size=1024)]).start()
        try:
            via = httpx.Client(base_url=server.url, timeout=60)
            via.post("/v1/chat/completions", json={"model": "smol", **BODIES[
                "/v1/chat/completions"]}).raise_for_status()  # loaded
            flags = llama_flags(worker_argv(server, "smol"))
            port = server.status()["slots"][0]["port"]
            key = worker_process(server, "smol").environ()["LLAMA_API_KEY"]
            direct = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60,
                                  headers={"authorization": f"Bearer {key}"})
            sides = [(route, stream, name, client) for route in BODIES
                     for stream in (False, True)
                     for name, client in (("model-boss", via), ("direct", direct))]
            compared = {  # every side asks the one worker, whole and streamed, in turns
                f"{route} {name}": {"route": route, "path": name,
                                    "base_url": str(client.base_url), "body": BODIES[route],
                                    "requests": args.requests, **flags,
                                    "worker": f"127.0.0.1:{port}"}
                for route in BODIES for name, client in (("model-boss", via),
                                                         ("direct", direct))}
            check_sides(compared, ["route", "body", "path", "base_url"])
            for route in BODIES:  # each route's own two sides: only the path differs
                same_except({k: v for k, v in compared.items() if v["route"] == route},
                            ["path", "base_url"])
            times: dict[tuple, list[float]] = {side[:3]: [] for side in sides}
            for _ in range(args.requests):  # in turns, so noise falls on every side alike
                for route, stream, name, client in sides:
                    times[(route, stream, name)].append(timed(client, route, stream))
        finally:
            server.stop()
    med = {side: statistics.median(values) * 1000 for side, values in times.items()}
    print(f"SmolLM2-135M-Instruct Q4_1, 8 tokens greedy, CPU; medians of {args.requests} "
          "requests per side, sides in turns")
    print(f"{'route':<24}{'answer':>9}{'direct ms':>11}{'via ms':>9}{'overhead ms':>13}"
          f"{'x direct':>10}")
    overhead = {}
    for route in BODIES:
        for stream in (False, True):
            d, v = med[(route, stream, "direct")], med[(route, stream, "model-boss")]
            overhead[(route, stream)] = v - d
            print(f"{route:<24}{'stream' if stream else 'whole':>9}{d:>11.1f}{v:>9.1f}"
                  f"{v - d:>13.1f}{v / d:>10.2f}")
    for stream in (False, True):
        chat = overhead[("/v1/chat/completions", stream)]
        messages = overhead[("/v1/messages", stream)]
        print(f"messages overhead - chat overhead, {'stream' if stream else 'whole'}: "
              f"{messages - chat:+.1f} ms")


if __name__ == "__main__":
    main()
