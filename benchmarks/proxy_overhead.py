"""Proxy overhead: direct to an OpenAI-compatible upstream vs through model-boss, one run.

Starts ``tests/fake_upstream.py`` and a model-boss serving it through a ``cloud`` manifest,
then drives both with a small keep-alive HTTP/1.1 load generator (raw asyncio sockets, so the
client is not the bottleneck): p50/p99 latency at concurrency 1, requests/s at concurrency 32,
and the time to the first streamed chunk when the upstream spaces its chunks out.

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
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.conftest import ServerProcess, free_port, wait_for

BODY = b'{"model":"%s","messages":[{"role":"user","content":"ping"}],"max_tokens":8}'


def request_bytes(port: int, model: str, stream: bool = False) -> bytes:
    body = BODY % model.encode()
    if stream:
        body = body[:-1] + b',"stream":true}'
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (port, len(body))) + body


async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
              payload: bytes) -> None:
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
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    times = []
    for _ in range(count):
        started = time.perf_counter()
        await one(reader, writer, payload)
        times.append(time.perf_counter() - started)
    writer.close()
    return times


async def throughput(port: int, payload: bytes, concurrency: int, seconds: float) -> float:
    done = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.perf_counter() < stop:
            await one(reader, writer, payload)
            done += 1
        writer.close()

    started = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return done / (time.perf_counter() - started)


async def first_chunk(url: str, model: str) -> float:
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    async with httpx.AsyncClient(timeout=30) as client:
        started = time.perf_counter()
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    return time.perf_counter() - started
    raise RuntimeError("no chunk")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    up_port = free_port()
    upstream = subprocess.Popen([sys.executable, "-m", "tests.fake_upstream", "--port",
                                 str(up_port)])
    slow_port = free_port()
    slow = subprocess.Popen([sys.executable, "-m", "tests.fake_upstream", "--port",
                             str(slow_port), "--chunk-delay-ms", "200", "--chunks", "3"])
    with tempfile.TemporaryDirectory() as tmp:
        manifests = [{"id": "claude:fake", "backend": "cloud", "category": "llm",
                      "base_url": f"http://127.0.0.1:{up_port}/v1"},
                     {"id": "claude:slow", "backend": "cloud", "category": "llm",
                      "base_url": f"http://127.0.0.1:{slow_port}/v1"}]
        server = ServerProcess(Path(tmp), {"log_level": "WARNING"}, manifests).start()
        try:
            wait_for(lambda: httpx.post(server.url + "/v1/chat/completions", timeout=10,
                                        content=BODY % b"claude:fake").status_code == 200)
            direct = request_bytes(up_port, "claude:fake")
            proxied = request_bytes(server.port, "claude:fake")
            rows = asyncio.run(measure(args, up_port, server.port, direct, proxied))
            direct_first, proxied_first = [], []
            for _ in range(5):  # interleaved, so both sides see the same machine
                direct_first.append(asyncio.run(first_chunk(f"http://127.0.0.1:{slow_port}",
                                                            "x")) * 1000)
                proxied_first.append(asyncio.run(first_chunk(server.url, "claude:slow")) * 1000)
            rows["first chunk, upstream chunks 200 ms apart (ms)"] = (
                statistics.median(direct_first), statistics.median(proxied_first))
        finally:
            server.stop()
            for proc in (upstream, slow):
                proc.terminate()
                proc.wait(10)
    print(f"OpenAI chat completion through a cloud manifest; {args.requests} sequential "
          f"requests, {args.seconds:g}s at concurrency {args.concurrency}")
    print(f"{'measurement':<48}{'direct':>10}{'proxied':>10}{'ratio':>8}{'added':>11}")
    for name, (d, p) in rows.items():
        print(f"{name:<48}{d:>10.2f}{p:>10.2f}{p / d:>8.2f}{p - d:>+11.2f}")


async def measure(args, up_port, mb_port, direct, proxied) -> dict[str, tuple[float, float]]:
    await latencies(up_port, direct, 100)  # warm both paths
    await latencies(mb_port, proxied, 100)
    d_lat = await latencies(up_port, direct, args.requests)
    p_lat = await latencies(mb_port, proxied, args.requests)
    d_rps = await throughput(up_port, direct, args.concurrency, args.seconds)
    p_rps = await throughput(mb_port, proxied, args.concurrency, args.seconds)
    ms = 1000
    return {
        "p50 latency, concurrency 1 (ms)": (statistics.median(d_lat) * ms,
                                            statistics.median(p_lat) * ms),
        "p99 latency, concurrency 1 (ms)": (pct(d_lat, 0.99) * ms, pct(p_lat, 0.99) * ms),
        f"requests/s, concurrency {args.concurrency}": (d_rps, p_rps),
    }


if __name__ == "__main__":
    main()
