"""N chat requests at once for one model: does the coordinator stay cheap as its queue grows?

A ``cloud`` model with ``parallel: 4`` over a local stand-in remote (``tests/fake_upstream.py``)
that answers after 20 ms, so the ideal wall time is N / 4 × 20 ms; the requests come from 8
client ids; the queue limits are raised so every request is admitted. For each N the client
sends all N at once (one asyncio process, one connection per request; like a load generator it
uses model-boss's own lean HTTP client on uvloop, ``--client aiohttp`` for aiohttp) and waits
for the last answer. Prints one table: wall time, its ratio to the ideal, the CPU seconds per
request of the coordinator, the client and the stand-in (all three share this box), and how much
the coordinator's resident memory grew per waiting request at the burst's peak. After each burst
the same client sends the same N straight to the stand-in, which logs when each request arrives:
the time until the first one arrives is the client's own start (opening N connections in one
process: 0.1–0.2 s for 1,000 here, 2–3 s for 10,000), and the table shows the wall time less it
against the ideal too. ``--burst N`` also sends N at once against the default queue limits (how
many are refused, how fast).

    .venv/bin/python benchmarks/queue_scale.py [--sizes 250,1000,4000] [--before DIR]
        [--burst 5000] [--client lean|aiohttp]

``--before DIR`` measures another checkout's coordinator too (a worktree of an earlier
commit), in the same run, after this one.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.harness import BenchServer, check_sides, coordinator_side, free_port, wait_for
from model_boss.backends.http_link import HttpLink

PARALLEL = 4
DELAY_MS = 20.0
CLIENTS = 8
CLIENT = "lean"  # --client


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


async def burst(url: str, n: int, refusals: list[tuple[int, str | None]] | None = None,
                started_at: list[float] | None = None) -> float:
    """N requests at once, one connection each; every one must be answered 200, unless
    ``refusals`` collects the others (status, Retry-After). ``started_at`` gets the
    ``perf_counter()`` it began at. The client is :data:`CLIENT`'s."""
    send, close = _lean_client(url) if CLIENT == "lean" else _aiohttp_client(url)
    try:
        async def one(i: int) -> tuple[int, str | None]:
            return await send(orjson.dumps({
                "model": "remote", "max_tokens": 4,
                "messages": [{"role": "user", "content": f"request {i}"}]}),
                {"content-type": "application/json", "x-client-id": f"client-{i % CLIENTS}"})

        started = time.perf_counter()
        if started_at is not None:
            started_at.append(started)
        answers = await asyncio.gather(*(one(i) for i in range(n)))
        took = time.perf_counter() - started
    finally:
        await close()
    bad = [a for a in answers if a[0] != 200]
    if refusals is None:
        assert not bad, f"{len(bad)} of {n} answered {sorted({s for s, _ in bad})}"
    else:
        refusals.extend(bad)
    return took


def run(burst: Coroutine[Any, Any, float]) -> float:
    """A burst on the client's event loop: uvloop's (as the coordinator's) for the lean
    client, asyncio's own for aiohttp."""
    if CLIENT == "lean":
        return uvloop.run(burst)
    return asyncio.run(burst)


def _lean_client(url: str):
    """Like a load generator: model-boss's own keep-alive client (httptools on an asyncio
    protocol), kept to one connection per request (nothing pooled)."""
    link = HttpLink(url, timeout_s=3600, connect_timeout_s=600, max_idle=0)

    async def send(body: bytes, headers: dict[str, str]) -> tuple[int, str | None]:
        reply = await link.post("/v1/chat/completions", body, headers, stream=False)
        return reply.status, reply.retry_after

    return send, link.close


def _aiohttp_client(url: str):
    """aiohttp, one connection per request (what an asyncio batch script would use)."""
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                    timeout=aiohttp.ClientTimeout(total=3600))

    async def send(body: bytes, headers: dict[str, str]) -> tuple[int, str | None]:
        async with session.post(url + "/v1/chat/completions", data=body,
                                headers=headers) as reply:
            await reply.read()
            return reply.status, reply.headers.get("retry-after")

    return send, session.close


class PeakRss:
    """The largest resident size of a process while the block runs (sampled every 20 ms)."""

    def __init__(self, process: psutil.Process) -> None:
        self.process, self.peak, self._stop = process, 0, threading.Event()

    def __enter__(self) -> PeakRss:
        self.base = self.process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="250,1000,4000")
    parser.add_argument("--before", type=Path, default=None)
    parser.add_argument("--burst", type=int, default=0,
                        help="also send this many at once against the default queue limits")
    parser.add_argument("--client", choices=["lean", "aiohttp"], default="lean",
                        help="the client's HTTP library (lean: model-boss's httptools client)")
    args = parser.parse_args()
    global CLIENT
    CLIENT = args.client
    sizes = [int(n) for n in args.sizes.split(",") if n]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a socket per request
    port = free_port()
    arrivals = Path(tempfile.mkdtemp()) / "arrivals.log"
    remote = subprocess.Popen([sys.executable, "-m", "tests.fake_upstream", "--port", str(port),
                               "--answer-delay-ms", str(DELAY_MS), "--arrivals-log",
                               str(arrivals)])
    try:
        wait_for(lambda: remote.poll() is None and _up(port), timeout=30)
        upstream = psutil.Process(remote.pid)
        checkouts = {"this code": None}
        if args.before:
            checkouts[f"before ({args.before.name})"] = args.before.resolve()
        runs = {name: measure(port, upstream, sizes, checkout, arrivals)
                for name, checkout in checkouts.items() if sizes}
        over = {name: limited(port, args.burst, checkout)
                for name, checkout in checkouts.items()} if args.burst else {}
    finally:
        remote.terminate()
        remote.wait()
    fixed = {"clients": CLIENTS, "answer_delay_ms": DELAY_MS, "client": CLIENT}
    if runs:
        check_sides({name: {**side, **fixed, "sizes": args.sizes}
                     for name, (side, _) in runs.items()}, ["code"], "coordinators compared")
    if over:
        check_sides({name: {**side, **fixed, "burst": args.burst}
                     for name, (side, _) in over.items()}, ["code"],
                    "coordinators compared over the default limits")
    print(f"\nN chat requests at once, one cloud model (parallel {PARALLEL}) over a stand-in "
          f"that answers after {DELAY_MS:g} ms, {CLIENTS} client ids, the {CLIENT} client, "
          f"this box ({psutil.cpu_count()} cores)\n")
    print("| coordinator | N | wall, s | x ideal | client's own start, s | x ideal less it | "
          "coordinator CPU ms/request | client | stand-in | coordinator RSS growth, "
          "KB/request |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, (_, rows) in runs.items():
        for n, wall, ratio, own_s, coord_ms, client_ms, remote_ms, kb in rows:
            print(f"| {name} | {n:,} | {wall:.1f} | {ratio:.2f}× | {own_s:.2f} | "
                  f"{(wall - own_s) / ideal_s(n):.2f}× | {coord_ms:.2f} | {client_ms:.2f} | "
                  f"{remote_ms:.2f} | {kb:.1f} |")
    if runs:
        print("\nclient's own start: the same burst sent straight to the stand-in, from its "
              "start to its first request's arrival (opening N connections in one process)")
    if over:
        print(f"\nDefault limits (max_queue_depth 1000, max_queued_per_client 200), "
              f"{args.burst:,} at once from {CLIENTS} clients\n")
        print("| coordinator | served | refused with 429 | with Retry-After | wall, s | "
              "coordinator CPU ms/request, served or refused |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, (_, (n, wall, refused, hinted, cpu_ms)) in over.items():
            print(f"| {name} | {n - refused:,} | {refused:,} | {hinted:,} | {wall:.1f} | "
                  f"{cpu_ms:.2f} |")


def limited(port: int, n: int, checkout: Path | None
            ) -> tuple[dict, tuple[int, float, int, int, float]]:
    """A burst over the default queue limits: the coordinator's side, then how many are
    refused, how fast, at what CPU (``checkout``'s code when given)."""
    with tempfile.TemporaryDirectory() as tmp:
        server = BenchServer(Path(tmp), {"log_level": "WARNING"},
                             [{"id": "remote", "backend": "cloud", "category": "llm",
                               "parallel": PARALLEL,
                               "base_url": f"http://127.0.0.1:{port}/v1"}])
        if checkout is not None:
            server.checkout = checkout
        side = coordinator_side(server)
        try:
            server.start()
            coordinator = psutil.Process(server.proc.pid)
            run(burst(server.url, 20))
            refusals: list[tuple[int, str | None]] = []
            before = cpu_s(coordinator)
            wall = run(burst(server.url, n, refusals))
            cpu_ms = (cpu_s(coordinator) - before) / n * 1000
        finally:
            server.stop()
    assert {status for status, _ in refusals} <= {429}, refusals[:3]
    return side, (n, wall, len(refusals), sum(1 for _, hint in refusals if hint), cpu_ms)


def ideal_s(n: int) -> float:
    return n / PARALLEL * DELAY_MS / 1000


def own_start_s(port: int, n: int, arrivals: Path) -> float:
    """How long the client takes, sending N at once straight to the stand-in, until its first
    request arrives there: the part of a burst's wall time that is the client's own."""
    started: list[float] = []
    run(burst(f"http://127.0.0.1:{port}", n, started_at=started))
    return min(t for t in map(float, arrivals.read_text().split()) if t >= started[0]) \
        - started[0]


def measure(port: int, upstream: psutil.Process, sizes: list[int],
            checkout: Path | None, arrivals: Path) -> tuple[dict, list[tuple]]:
    """Each N in turn on a fresh coordinator (``checkout``'s code when given), each followed
    by the same burst straight to the stand-in; its side."""
    biggest = max(sizes)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        server = BenchServer(Path(tmp), {
            "log_level": "WARNING", "max_queue_depth": biggest * 2,
            "max_queued_per_client": biggest * 2, "max_queue_wait_s": 3600,
            "request_timeout_s": 3600},
            [{"id": "remote", "backend": "cloud", "category": "llm", "parallel": PARALLEL,
              "base_url": f"http://127.0.0.1:{port}/v1"}])
        if checkout is not None:
            server.checkout = checkout
        side = coordinator_side(server)
        try:
            server.start()
            coordinator, me = psutil.Process(server.proc.pid), psutil.Process()
            run(burst(server.url, 20))  # warm
            for n in sizes:
                before = [cpu_s(p) for p in (coordinator, me, upstream)]
                with PeakRss(coordinator) as rss:
                    wall = run(burst(server.url, n))
                after = [cpu_s(p) for p in (coordinator, me, upstream)]
                per = [(a - b) / n * 1000 for a, b in zip(after, before, strict=True)]
                grown_kb = max(0, rss.peak - rss.base) / 1024 / n
                rows.append((n, wall, wall / ideal_s(n), own_start_s(port, n, arrivals), *per,
                             grown_kb))
        finally:
            server.stop()
    return side, rows


def _up(port: int) -> bool:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
