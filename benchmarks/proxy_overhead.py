"""Proxy overhead: direct to an OpenAI-compatible upstream vs through model-boss, one run.

Starts ``tests/fake_upstream.py`` (a keyed one, and a slow streamer) and a model-boss on a
declared GPU serving them through ``cloud`` manifests, warms both paths up, then measures
non-streaming chat completions with a keep-alive HTTP/1.1 load generator on raw asyncio
sockets (a pre-encoded request, the answer read by content-length or chunked framing):

- p50 / p99 latency at concurrency 1 (``--requests`` sequential requests on one connection);
- requests/s at concurrency 32 (``--seconds`` of 32 connections in one client process: on
  a 2-core box more client processes only take CPU from the servers; the client alone does
  ~20,000 requests/s against the direct upstream, so it is not what limits the proxied run);
- the CPU each server process spends per request in that run (the fake upstream direct,
  model-boss proxied: model-boss's own cost, whatever the box);
- the time to the first streamed chunk when the upstream spaces its chunks 200 ms apart
  (a proxy that buffers shows up as hundreds of ms added).

Prints one table with the targets (≤ 1 ms added at p50, ≥ 1,000 proxied requests/s at
concurrency 32, first chunk ≤ 5 ms later than direct). Loopback only; ends by itself.

    .venv/bin/python benchmarks/proxy_overhead.py [--requests 1000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.harness import BenchServer, check_sides, free_port, wait_for

KEY = "bench-key"
BODY = b'{"model":"%s","messages":[{"role":"user","content":"ping"}],"max_tokens":8}'
GPU = {"gpus": [{"index": 0, "name": "sim-24g", "vram_mb": 24576}]}


@dataclass(frozen=True, slots=True)
class Row:
    """One measurement, direct and proxied, and the target the proxied side must meet."""

    name: str
    direct: float
    proxied: float
    target: str = "-"
    met: Callable[[float, float], bool] | None = None
    additive: bool = True  # a time the proxy adds to; not so for rates and CPU shares

    def cells(self) -> str:
        added = f"{self.proxied - self.direct:+.2f}" if self.additive else "-"
        verdict = "-" if self.met is None else ("yes" if self.met(self.direct, self.proxied)
                                                else "MISS")
        return (f"{self.name:<46}{self.direct:>10.2f}{self.proxied:>10.2f}"
                f"{self.proxied / self.direct:>8.2f}{added:>9}{self.target:>17}{verdict:>6}")


def request_bytes(port: int, model: str, *, key: str | None = None,
                  stream: bool = False) -> bytes:
    """One pre-encoded keep-alive chat completion request."""
    body = BODY % model.encode()
    if stream:
        body = body[:-1] + b',"stream":true}'
    auth = b"Authorization: Bearer %s\r\n" % key.encode() if key else b""
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n%s"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (port, auth, len(body))) + body


async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
              payload: bytes) -> None:
    """Send one request and read its whole answer; anything but 200 stops the run."""
    writer.write(payload)
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head.split(b"\r\n", 1)[0].decode())
    lowered = head.lower()
    if b"content-length:" in lowered:
        length = int(lowered.split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
    else:  # chunked
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break


async def latencies(port: int, payload: bytes, count: int) -> list[float]:
    """Seconds per request for ``count`` sequential requests on one connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    times = []
    try:
        for _ in range(count):
            started = time.perf_counter()
            await one(reader, writer, payload)
            times.append(time.perf_counter() - started)
    finally:
        writer.close()
    return times


async def throughput(port: int, payload: bytes, concurrency: int,
                     seconds: float) -> tuple[int, float]:
    """Requests done, and the seconds taken, by ``concurrency`` keep-alive connections
    sending for about ``seconds``."""
    done = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < stop:
                await one(reader, writer, payload)
                done += 1
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return done, time.perf_counter() - started


async def loaded(server: psutil.Process, port: int, payload: bytes, concurrency: int,
                 seconds: float) -> tuple[float, float]:
    """Requests/s under load, and the server process's CPU milliseconds per request."""
    before = server.cpu_times()
    done, took = await throughput(port, payload, concurrency, seconds)
    after = server.cpu_times()
    cpu_s = (after.user - before.user) + (after.system - before.system)
    return done / took, cpu_s * 1000 / done


async def first_chunk(url: str, model: str, key: str | None = None) -> float:
    """Seconds from sending a streaming request to its first ``data:`` line."""
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    headers = {"authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(timeout=30) as client:
        started = time.perf_counter()
        async with client.stream("POST", url + "/v1/chat/completions", json=body,
                                 headers=headers) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    return time.perf_counter() - started
    raise RuntimeError("the stream ended without a chunk")


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(args: argparse.Namespace, upstream: psutil.Process, up_port: int,
                  slow_port: int, server: BenchServer) -> list[Row]:
    """Every measurement, direct and proxied, in one event loop."""
    assert server.proc is not None
    mb_port, coordinator = server.port, psutil.Process(server.proc.pid)
    direct = request_bytes(up_port, "remote-x", key=KEY)
    proxied = request_bytes(mb_port, "claude:fake")
    await latencies(up_port, direct, 200)  # warm both paths (connections, caches)
    await latencies(mb_port, proxied, 200)
    await throughput(mb_port, proxied, args.concurrency, 0.5)
    d_lat = await latencies(up_port, direct, args.requests)
    p_lat = await latencies(mb_port, proxied, args.requests)
    d_rps, d_cpu = await loaded(upstream, up_port, direct, args.concurrency, args.seconds)
    p_rps, p_cpu = await loaded(coordinator, mb_port, proxied, args.concurrency, args.seconds)
    d_first, p_first = [], []
    for _ in range(5):  # interleaved, so both sides see the same machine
        d_first.append(await first_chunk(f"http://127.0.0.1:{slow_port}", "remote-x", KEY))
        p_first.append(await first_chunk(server.url, "claude:slow"))
    ms = 1000
    return [
        Row("p50 latency, concurrency 1 (ms)", statistics.median(d_lat) * ms,
            statistics.median(p_lat) * ms, "added <= 1.00", lambda d, p: p - d <= 1.0),
        Row("p99 latency, concurrency 1 (ms)", pct(d_lat, 0.99) * ms, pct(p_lat, 0.99) * ms),
        Row(f"requests/s, concurrency {args.concurrency}", d_rps, p_rps,
            "proxied >= 1000", lambda d, p: p >= 1000, additive=False),
        Row(f"server CPU per request, conc. {args.concurrency} (ms)", d_cpu, p_cpu,
            additive=False),
        Row("first chunk, chunks 200 ms apart (ms)", statistics.median(d_first) * ms,
            statistics.median(p_first) * ms, "added <= 5.00", lambda d, p: p - d <= 5.0),
    ]


def start_upstream(*flags: str) -> tuple[subprocess.Popen, int]:
    """A fake upstream process on a free port."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.fake_upstream", "--port", str(port),
                             "--require-key", KEY, *flags])
    return proc, port


def up(port: int) -> bool:
    """Whether the fake upstream on ``port`` answers."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1,
                         headers={"authorization": f"Bearer {KEY}"}).status_code == 200
    except httpx.HTTPError:
        return False


def load_args(doc: str | None) -> argparse.Namespace:
    """The flags both this and cluster_forward.py take: how many sequential requests, how
    long each throughput run lasts, at which concurrency."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000,
                        help="sequential requests for the concurrency-1 latencies")
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="duration of each throughput run")
    parser.add_argument("--concurrency", type=int, default=32)
    return parser.parse_args()


def load_settings(args: argparse.Namespace) -> dict:
    """What the load generator sends, the same to either side."""
    return {"body": BODY.decode() % "MODEL", "requests": args.requests,
            "seconds": args.seconds, "concurrency": args.concurrency}


def main() -> None:
    args = load_args(__doc__)
    processes: list[subprocess.Popen] = []
    server: BenchServer | None = None
    try:
        upstream, up_port = start_upstream()
        processes.append(upstream)
        slow, slow_port = start_upstream("--chunk-delay-ms", "200", "--chunks", "3")
        processes.append(slow)
        wait_for(lambda: up(up_port) and up(slow_port), timeout=20)
        manifests = [{"id": "claude:fake", "backend": "cloud", "category": "llm",
                      "base_url": f"http://127.0.0.1:{up_port}/v1",
                      "api_key_env": "BENCH_UPSTREAM_KEY", "remote_model": "remote-x"},
                     {"id": "claude:slow", "backend": "cloud", "category": "llm",
                      "base_url": f"http://127.0.0.1:{slow_port}/v1",
                      "api_key_env": "BENCH_UPSTREAM_KEY", "remote_model": "remote-x"}]
        with tempfile.TemporaryDirectory() as tmp:
            server = BenchServer(Path(tmp), {"log_level": "WARNING", **GPU}, manifests,
                                   env={"BENCH_UPSTREAM_KEY": KEY}).start()
            load = load_settings(args)
            check_sides({
                "direct": {"path": "client -> upstream", "model": "remote-x",
                           "upstream": f"http://127.0.0.1:{up_port}/v1",
                           "slow_upstream": f"http://127.0.0.1:{slow_port}/v1", **load},
                "proxied": {"path": "client -> model-boss -> upstream",
                            "model": manifests[0]["remote_model"],
                            "upstream": manifests[0]["base_url"],
                            "slow_upstream": manifests[1]["base_url"], **load}},
                measured=["path"])
            rows = asyncio.run(measure(args, psutil.Process(upstream.pid), up_port, slow_port,
                                       server))
            server.stop()
            server = None
    finally:
        if server is not None:
            server.stop()
        for proc in processes:
            proc.terminate()
            proc.wait(10)
    print(f"OpenAI chat completion through a cloud manifest; {args.requests} sequential "
          f"requests, {args.seconds:g}s at concurrency {args.concurrency}")
    print(f"{'measurement':<46}{'direct':>10}{'proxied':>10}{'ratio':>8}{'added':>9}"
          f"{'target':>17}{'met':>6}")
    for row in rows:
        print(row.cells())


if __name__ == "__main__":
    main()
