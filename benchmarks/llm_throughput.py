"""LLM worker throughput and cold start on the demo model, side by side in one run.

Tokens per second with 1 and 8 concurrent streaming clients (``stream_options.include_usage``
gives each stream's completion tokens; ``ignore_eos`` makes every answer ``--tokens`` long):

- direct: llama.cpp's native server (``python -m workers.llama``, from ``xllamacpp``) alone;
- through model-boss: the same worker kind behind the coordinator (manifest ``parallel: 8``);
- llama_cpp.server: llama-cpp-python's server, when that optional package is installed.

Cold start: the time from nothing running to the first streamed token — starting the native
server by hand and asking it, against asking model-boss for a model it has not loaded (its
worker start + load + first token). Direct and through model-boss are measured in turns,
medians over ``--runs``. Prints one table. Loopback only.

Both sides run llama.cpp with the same flags (``--threads`` defaults to llama.cpp's own
choice, a thread per core); the flags each side's server really runs with are read from its
command line, printed under the table, and a run whose sides differ stops before measuring.

    .venv/bin/python benchmarks/llm_throughput.py [--tokens 64] [--runs 5] [--threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.harness import (
    DEFAULT_THREADS,
    DEMO_GGUF,
    BenchServer,
    demo_manifest,
    free_port,
    llama_flags,
    print_sides,
    same_except,
    wait_for,
    worker_argv,
)

ROOT = Path(__file__).resolve().parent.parent
PARALLEL = 8
PROMPT = [{"role": "user", "content": "Tell me a long story about a lighthouse."}]


def start_native(gguf: Path, parallel: int, threads: int,
                 ) -> tuple[subprocess.Popen, str, dict]:
    port = free_port()
    key = "bench-secret"
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.llama", "--model", str(gguf), "--port", str(port),
         "--ctx-size", str(1024 * parallel), "--parallel", str(parallel),
         "--threads", str(threads), "--n-gpu-layers", "999"],
        cwd=ROOT, env={**os.environ, "LLAMA_API_KEY": key},
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}", {"authorization": f"Bearer {key}"}


def start_llama_cpp_python(gguf: Path, parallel: int) -> tuple[subprocess.Popen, str, dict]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--port", str(port),
         "--n_ctx", "1024", "--interrupt_requests", "False"],  # else a new stream cuts the last
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}", {}


def healthy(url: str, headers: dict) -> bool:
    try:
        return httpx.get(url + "/v1/models", headers=headers, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


async def one_stream(client: httpx.AsyncClient, url: str, headers: dict, model: str,
                     tokens: int) -> tuple[int, float]:
    """(completion tokens, seconds to the first content chunk)."""
    body = {"model": model, "messages": PROMPT, "max_tokens": tokens, "stream": True,
            "ignore_eos": True, "temperature": 0, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first = None
    chunks = usage = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body,
                             headers=headers) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices", [])):
                first = first if first is not None else time.perf_counter() - started
                chunks += 1
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
    # the usage chunk where the server sends one; else one content chunk per token
    return usage or chunks, first if first is not None else float("nan")


async def tokens_per_second(url: str, headers: dict, model: str, clients: int,
                            tokens: int) -> float:
    # a fresh connection per stream, the same for every server measured: llama.cpp's server
    # closes idle keep-alive connections on its own schedule
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        await one_stream(client, url, headers, model, 4)  # warm up
        started = time.perf_counter()
        results = await asyncio.gather(*[one_stream(client, url, headers, model, tokens)
                                         for _ in range(clients)])
        elapsed = time.perf_counter() - started
    return sum(count for count, _ in results) / elapsed


def tps(url: str, headers: dict, model: str, clients: int, tokens: int) -> float:
    return asyncio.run(tokens_per_second(url, headers, model, clients, tokens))


def cold_native(gguf: Path, threads: int, seen: dict) -> float:
    started = time.perf_counter()
    proc, url, headers = start_native(gguf, 1, threads)
    seen.setdefault("native server started by hand", llama_flags(proc.args))
    try:
        wait_for(lambda: healthy(url, headers), timeout=120, interval=0.02)

        async def first() -> float:
            async with httpx.AsyncClient(timeout=120) as client:
                return (await one_stream(client, url, headers, "x", 1))[1]

        asyncio.run(first())
        return time.perf_counter() - started
    finally:
        proc.terminate()
        proc.wait(30)


def cold_through(server: BenchServer, model: str, seen: dict) -> float:
    httpx.post(f"{server.url}/api/v1/models/{model}/unload", timeout=60)

    async def first() -> float:
        async with httpx.AsyncClient(timeout=120) as client:
            started = time.perf_counter()
            await one_stream(client, server.url, {}, model, 1)
            return time.perf_counter() - started

    elapsed = asyncio.run(first())
    seen.setdefault("through model-boss (not loaded)", llama_flags(worker_argv(server, model)))
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                        help="llama.cpp threads, the same on every side")
    args = parser.parse_args()
    gguf = DEMO_GGUF  # scripts/setup.sh fetched it
    # direct and through model-boss are measured in turns (which goes first alternates from
    # run to run), so drift on a shared machine falls on both; the ratio is the median of each
    # run's own ratio
    direct: dict[int, list[float]] = {1: [], PARALLEL: []}
    through: dict[int, list[float]] = {1: [], PARALLEL: []}
    cold_alone: list[float] = []
    cold_mb: list[float] = []
    cold_sides: dict[str, dict] = {}
    proc, url, headers = start_native(gguf, PARALLEL, args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        gpu = {"index": 0, "name": "sim-8g", "vram_mb": 8192}
        server = BenchServer(Path(tmp), {"gpus": [gpu]}, [
            demo_manifest("smol", gguf=gguf, threads=args.threads, ctx_size=1024 * PARALLEL,
                          parallel=PARALLEL, vram_mb=2000),
            demo_manifest("cold", gguf=gguf, threads=args.threads, ctx_size=1024,
                          vram_mb=2000)]).start()
        try:
            wait_for(lambda: healthy(url, headers), timeout=120)
            tps(server.url, {}, "smol", 1, 4)  # its worker started, to read its flags
            warm_sides = {"direct": llama_flags(proc.args),
                          "through model-boss": llama_flags(worker_argv(server, "smol"))}
            same_except(warm_sides)
            for run in range(args.runs):
                for n in (1, PARALLEL):
                    sides = [(direct, url, headers, "x"), (through, server.url, {}, "smol")]
                    for figures, base, auth, model in sides[::1 if run % 2 else -1]:
                        figures[n].append(tps(base, auth, model, n, args.tokens))
                pair = [(cold_alone, lambda: cold_native(gguf, args.threads, cold_sides)),
                        (cold_mb, lambda: cold_through(server, "cold", cold_sides))]
                for figures, measure_cold in pair[::1 if run % 2 else -1]:
                    figures.append(measure_cold())
                same_except(cold_sides)
        finally:
            server.stop()
            proc.terminate()
            proc.wait(30)

    other = None
    if importlib.util.find_spec("llama_cpp") is not None:
        proc, url, headers = start_llama_cpp_python(gguf, PARALLEL)
        try:
            wait_for(lambda: healthy(url, headers), timeout=120)
            other = {n: [tps(url, headers, "x", n, args.tokens) for _ in range(args.runs)]
                     for n in (1, PARALLEL)}
        finally:
            proc.terminate()
            proc.wait(30)

    med = statistics.median

    def ratio(a: list[float], b: list[float]) -> float:
        return med(x / y for x, y in zip(a, b, strict=True))

    print(f"SmolLM2-135M Q4_1, {args.tokens} tokens per answer, medians of {args.runs} runs "
          f"taken in turns, {os.cpu_count()} CPU cores")
    print(f"{'tokens/s':<40}{'1 client':>10}{'x direct':>10}{'8 clients':>11}{'x direct':>10}")
    print(f"{'direct: native llama.cpp server':<40}{med(direct[1]):>10.1f}{1.0:>10.2f}"
          f"{med(direct[PARALLEL]):>11.1f}{1.0:>10.2f}")
    print(f"{'through model-boss (native worker)':<40}{med(through[1]):>10.1f}"
          f"{ratio(through[1], direct[1]):>10.2f}{med(through[PARALLEL]):>11.1f}"
          f"{ratio(through[PARALLEL], direct[PARALLEL]):>10.2f}")
    name = "llama_cpp.server (llama-cpp-python)"
    if other is None:
        print(f"{name:<40}{'not installed':>41}")
    else:  # measured after the others, not in turns: its ratio is of medians
        print(f"{name:<40}{med(other[1]):>10.1f}{med(other[1]) / med(direct[1]):>10.2f}"
              f"{med(other[PARALLEL]):>11.1f}"
              f"{med(other[PARALLEL]) / med(direct[PARALLEL]):>10.2f}")
    print(f"{'cold start to first token (s)':<40}{'seconds':>10}{'x alone':>10}")
    print(f"{'native server started by hand':<40}{med(cold_alone):>10.3f}{1.0:>10.2f}")
    print(f"{'through model-boss (not loaded)':<40}{med(cold_mb):>10.3f}"
          f"{ratio(cold_mb, cold_alone):>10.2f}")
    print("llama.cpp flags each side ran with (read from its command line):")
    print_sides({**{f"tokens/s, {k}": v for k, v in warm_sides.items()},
                 **{f"cold start, {k}": v for k, v in cold_sides.items()}})


if __name__ == "__main__":
    main()
