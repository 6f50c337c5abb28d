"""Cluster forwarding: a request to member B directly vs the same request sent to member A,
which forwards it to B (member → member over loopback), one run.

Starts a real ``redis-server``, ``tests/fake_upstream.py`` and two coordinators in one
cluster, each with its own declared GPU; the model (a ``cloud`` manifest over the fake
upstream, so the model's own time is near zero and what remains is the coordinators') is
warmed on B only, so every request A takes is forwarded. Then, with the load generator of
``benchmarks/proxy_overhead.py`` (keep-alive HTTP/1.1 on raw asyncio sockets):

- p50 / p99 latency at concurrency 1 (``--requests`` sequential requests on one connection);
- requests/s at concurrency 32 (``--seconds`` of 32 connections);
- the first streamed chunk when the upstream spaces its chunks 200 ms apart (a member that
  buffered a forwarded stream would add hundreds of ms).

Prints one table with the goal (forwarding adds ≤ 1 ms at p50). Loopback only; ends by itself.

    .venv/bin/python benchmarks/cluster_forward.py [--requests 1000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.harness import BenchServer, check_sides, coordinator_side, wait_for
from benchmarks.proxy_overhead import (
    KEY,
    Row,
    first_chunk,
    latencies,
    load_args,
    load_settings,
    loaded,
    pct,
    request_bytes,
    start_upstream,
    throughput,
    up,
)
from tests.conftest import RedisServer

SECRET = "bench-cluster-secret"


def member(workdir: Path, host: str, redis_url: str, manifests: list[dict]) -> BenchServer:
    return BenchServer(workdir / host, {
        "log_level": "WARNING", "redis_url": redis_url, "cluster": True, "host_id": host,
        "gpus": [{"index": 0, "name": f"sim-{host}", "vram_mb": 24576}]}, manifests,
        env={"BENCH_UPSTREAM_KEY": KEY, "MODEL_BOSS_CLUSTER_SECRET": SECRET})


async def measure(args: argparse.Namespace, a: BenchServer, b: BenchServer) -> list[Row]:
    assert a.proc is not None and b.proc is not None
    direct = request_bytes(b.port, "claude:fake")
    forwarded = request_bytes(a.port, "claude:fake")
    await latencies(b.port, direct, 200)  # warm both paths (connections, caches)
    await latencies(a.port, forwarded, 200)
    await throughput(a.port, forwarded, args.concurrency, 0.5)
    d_lat = await latencies(b.port, direct, args.requests)
    f_lat = await latencies(a.port, forwarded, args.requests)
    d_rps, b_cpu = await loaded(psutil.Process(b.proc.pid), b.port, direct,
                                args.concurrency, args.seconds)
    f_rps, a_cpu = await loaded(psutil.Process(a.proc.pid), a.port, forwarded,
                                args.concurrency, args.seconds)
    d_first, f_first = [], []
    for _ in range(5):  # interleaved, so both sides see the same machine
        d_first.append(await first_chunk(b.url, "claude:slow"))
        f_first.append(await first_chunk(a.url, "claude:slow"))
    ms = 1000
    return [
        Row("p50 latency, concurrency 1 (ms)", statistics.median(d_lat) * ms,
            statistics.median(f_lat) * ms, "added <= 1.00", lambda d, p: p - d <= 1.0),
        Row("p99 latency, concurrency 1 (ms)", pct(d_lat, 0.99) * ms, pct(f_lat, 0.99) * ms),
        Row(f"requests/s, concurrency {args.concurrency}", d_rps, f_rps, additive=False),
        Row("CPU per request: B serving, A forwarding (ms)", b_cpu, a_cpu, additive=False),
        Row("first chunk, chunks 200 ms apart (ms)", statistics.median(d_first) * ms,
            statistics.median(f_first) * ms, "added <= 5.00", lambda d, p: p - d <= 5.0),
    ]


def served_by(server: BenchServer, model: str) -> str:
    response = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
        "model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]})
    response.raise_for_status()
    return response.headers["x-model-boss-member"]


def main() -> None:
    args = load_args(__doc__)
    processes: list[subprocess.Popen] = []
    servers: list[BenchServer] = []
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp)).start()
        try:
            upstream, up_port = start_upstream()
            slow, slow_port = start_upstream("--chunk-delay-ms", "200", "--chunks", "3")
            processes += [upstream, slow]
            wait_for(lambda: up(up_port) and up(slow_port), timeout=20)
            manifests = [{"id": name, "backend": "cloud", "category": "llm",
                          "base_url": f"http://127.0.0.1:{port}/v1",
                          "api_key_env": "BENCH_UPSTREAM_KEY", "remote_model": "remote-x"}
                         for name, port in (("claude:fake", up_port),
                                            ("claude:slow", slow_port))]
            a = member(Path(tmp), "a", redis.url, manifests)
            b = member(Path(tmp), "b", redis.url, manifests)
            servers += [a.start(60), b.start(60)]
            served = {"direct": {}, "forward": {}}
            for model in ("claude:fake", "claude:slow"):  # warm on B, then A forwards to B
                served["direct"][model] = served_by(b, model)
                assert served["direct"][model] == "b"
                wait_for(lambda m=model: any(
                    p["host_id"] == "b" and p["state"] == "ready" for p in httpx.get(
                        a.url + "/api/v1/cluster").json()["models"].get(m, [])), timeout=20)
                served["forward"][model] = served_by(a, model)
                assert served["forward"][model] == "b"
            load = load_settings(args)
            check_sides({  # the member a request enters by (its host_id) is what differs
                side: coordinator_side(entry, **load, served_by=",".join(
                    f"{m}@{h}" for m, h in served[side].items()))
                for side, entry in (("direct", b), ("forward", a))}, measured=["host_id"])
            rows = asyncio.run(measure(args, a, b))
        finally:
            for server in servers:
                server.stop()
            for proc in processes:
                proc.terminate()
                proc.wait(10)
            redis.stop()
    print(f"OpenAI chat completion (cloud manifest over a fake upstream), B directly vs A "
          f"forwarding to B; {args.requests} sequential requests, {args.seconds:g}s at "
          f"concurrency {args.concurrency}")
    print(f"{'measurement':<46}{'direct':>10}{'forward':>10}{'ratio':>8}{'added':>9}"
          f"{'target':>17}{'met':>6}")
    for row in rows:
        print(row.cells())


if __name__ == "__main__":
    main()
