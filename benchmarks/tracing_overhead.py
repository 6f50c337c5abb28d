"""Tracing overhead: what a request through the proxy costs with traces off and on, one run.

Starts ``tests/fake_upstream.py``, an OTLP/HTTP collector stand-in (a process of its own that
decodes each batch with opentelemetry-proto and counts its spans), and model-boss coordinators
serving the upstream through a ``cloud`` manifest, identical but for the measured thing:

- ``direct``: the client straight to the upstream (the baseline every side is measured from);
- ``off``: model-boss with no ``OTEL_*`` variable (the default: nothing of the SDK imported);
- ``on``: model-boss exporting every span to the collector (``OTEL_TRACES_SAMPLER=always_on``,
  sampled at 1.0; the batch processor's defaults: up to 2048 spans queued, sent every 5 s or
  every 512 from its own thread);
- ``before`` (with ``--before DIR``): another checkout's coordinator (a worktree of the tree
  before traces existed), traces off: "off equals today's".

The sides take turns: each round sends ``--requests`` sequential non-streaming chat
completions on one keep-alive connection to each side in turn (each request carries a
``traceparent``, as a traced caller's would), so every side sees the same machine. Printed:
each side's median over the rounds of its per-round median latency, its p99, the latency it
adds to direct, and the coordinator's CPU per request. Goal: off = before within noise,
on <= off + 0.2 ms. Loopback only; ends by itself.

    .venv/bin/python benchmarks/tracing_overhead.py [--requests 500] [--rounds 7] [--before DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.harness import BenchServer, check_sides, coordinator_side, free_port, wait_for
from benchmarks.proxy_overhead import GPU, KEY, latencies, pct, start_upstream, up

BODY = b'{"model":"%s","messages":[{"role":"user","content":"ping"}],"max_tokens":8}'
TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
# the collector stand-in: POST /v1/traces decoded and its spans counted; GET /count says how many
COLLECTOR = textwrap.dedent("""
    import sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest, ExportTraceServiceResponse)
    count = 0
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            global count
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = ExportTraceServiceRequest.FromString(body)
            count += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
            self.answer(ExportTraceServiceResponse().SerializeToString())
        def do_GET(self):
            self.answer(str(count).encode())
        def answer(self, data):
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def log_message(self, *args):
            pass
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
""")


def request_bytes(port: int, model: str, key: str | None = None) -> bytes:
    """One pre-encoded keep-alive chat completion request that carries a traceparent."""
    body = BODY % model.encode()
    auth = b"Authorization: Bearer %s\r\n" % key.encode() if key else b""
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n%s"
            b"traceparent: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (port, auth, TRACEPARENT, len(body))) + body


def spans_collected(port: int) -> int:
    return int(httpx.get(f"http://127.0.0.1:{port}/count", timeout=5).text)


async def measure(args: argparse.Namespace, sides: dict[str, tuple[int, bytes,
                                                                  psutil.Process | None]]
                  ) -> dict[str, dict[str, float]]:
    """Rounds of ``args.requests`` sequential requests to each side in turn."""
    for port, payload, _ in sides.values():  # warm every path (connections, caches)
        await latencies(port, payload, 200)
    medians: dict[str, list[float]] = {name: [] for name in sides}
    every: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, float] = dict.fromkeys(sides, 0.0)
    for _ in range(args.rounds):
        for name, (port, payload, process) in sides.items():
            before = process.cpu_times() if process else None
            times = await latencies(port, payload, args.requests)
            if process is not None and before is not None:
                after = process.cpu_times()
                cpu[name] += (after.user - before.user) + (after.system - before.system)
            medians[name].append(statistics.median(times))
            every[name].extend(times)
    ms = 1000
    total = args.rounds * args.requests
    return {name: {"p50": statistics.median(medians[name]) * ms,
                   "p99": pct(every[name], 0.99) * ms,
                   "spread": (max(medians[name]) - min(medians[name])) * ms,
                   "cpu": cpu[name] / total * ms}
            for name in sides}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500,
                        help="sequential requests to each side per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds, the sides in turns")
    parser.add_argument("--before", type=Path, default=None,
                        help="another checkout, measured with traces off beside this one")
    args = parser.parse_args()
    processes: list[subprocess.Popen] = []
    servers: dict[str, BenchServer] = {}
    try:
        upstream, up_port = start_upstream()
        processes.append(upstream)
        collector_port = free_port()
        processes.append(subprocess.Popen([sys.executable, "-c", COLLECTOR,
                                           str(collector_port)]))
        wait_for(lambda: up(up_port), timeout=20)
        wait_for(lambda: _answers(collector_port), timeout=20)
        manifests = [{"id": "claude:fake", "backend": "cloud", "category": "llm",
                      "base_url": f"http://127.0.0.1:{up_port}/v1",
                      "api_key_env": "BENCH_UPSTREAM_KEY", "remote_model": "remote-x"}]
        traced = {"OTEL_TRACES_EXPORTER": "otlp",
                  "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector_port}",
                  "OTEL_TRACES_SAMPLER": "always_on"}  # the batch processor's defaults
        checkouts = {"off": (None, {}), "on": (None, traced)}
        if args.before:
            checkouts["before"] = (args.before.resolve(), {})
        with tempfile.TemporaryDirectory() as tmp:
            for name, (checkout, env) in checkouts.items():
                server = BenchServer(Path(tmp) / name, {"log_level": "WARNING", **GPU},
                                     manifests, env={"BENCH_UPSTREAM_KEY": KEY, **env})
                if checkout is not None:
                    server.checkout = checkout
                servers[name] = server.start()
            check_sides({name: coordinator_side(server, tracing=("OTEL_* to the collector"
                                                                 if name == "on" else "off"))
                         for name, server in servers.items()}, measured=["code", "tracing"])
            sides: dict[str, tuple[int, bytes, psutil.Process | None]] = {
                "direct": (up_port, request_bytes(up_port, "remote-x", KEY), None)}
            for name, server in servers.items():
                assert server.proc is not None
                sides[name] = (server.port, request_bytes(server.port, "claude:fake"),
                               psutil.Process(server.proc.pid))
            results = asyncio.run(measure(args, sides))
            time.sleep(5.5)  # the last batch leaves within the processor's 5 s
            spans = spans_collected(collector_port)
    finally:
        for server in servers.values():
            server.stop()
        for proc in processes:
            proc.terminate()
            proc.wait(10)
    print(f"OpenAI chat completion through a cloud manifest; {args.rounds} rounds of "
          f"{args.requests} sequential requests to each side in turn; medians of the rounds' "
          f"medians; spans received by the collector: {spans}")
    print(f"{'side':<10}{'p50 (ms)':>10}{'p99 (ms)':>10}{'added p50':>11}{'vs off':>9}"
          f"{'round spread':>14}{'CPU/request (ms)':>18}")
    base, off = results["direct"]["p50"], results["off"]["p50"]
    for name, row in results.items():
        added = "-" if name == "direct" else f"{row['p50'] - base:+.3f}"
        versus = "-" if name in ("direct", "off") else f"{row['p50'] - off:+.3f}"
        cpu = "-" if name == "direct" else f"{row['cpu']:.3f}"
        print(f"{name:<10}{row['p50']:>10.3f}{row['p99']:>10.3f}{added:>11}{versus:>9}"
              f"{row['spread']:>14.3f}{cpu:>18}")


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/count", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
