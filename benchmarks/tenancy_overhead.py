"""Keys as tenants on the proxy path: the same proxied request with no keys, and with a
managed key whose rates and quotas are all checked and whose usage the ledger writes to
SQLite, side by side in turns.

Starts ``tests/fake_upstream.py`` and three coordinators serving it through a ``cloud``
manifest (the model's own time is near zero: what remains is the coordinators'):

- ``open``: no keys, the usage ledger off (``usage_ledger: false``);
- ``ledger``: no keys, the ledger on (the default: a row per request, key "");
- ``keys``: an admin key and one managed key with every rate and quota set (far above what
  the run uses, so each is checked and none refuses), the ledger on; the load sends it.

Then, in ``--rounds`` rounds, each side in turn (the order reversed every other round): p50
latency at concurrency 1 (``--requests`` sequential requests on one keep-alive connection),
requests/s at concurrency 32 (``--seconds``) and the coordinator's CPU per request in that
run, with the load generator of ``benchmarks/proxy_overhead.py``. Prints each side's median
(and range) and what ``keys`` adds over ``open``; then, in this process, the CPU the keyed
edge spends on one request (the key's lookup, its headers, its identity, and admission over a
minute of 6,000 requests and 30 days of hourly totals: CPU time, which a busy box inflates
far less than it does wall-clock latencies) and the ledger's raw write rate
(``benchmarks/ledger_writes.py``: 50,000 rows recorded at once, the background writer).

``--instructions`` measures instead what no busy box blurs: the instructions one request
costs through the whole app in one process (``tests/unit/fakes.py``'s worker, an in-process
client), with no keys, the ledger, a managed key, and a key with every limit, counted by
valgrind (``cachegrind --cache-sim=no``) for 40 and 240 requests: the difference over 200.

Goal: keys, limits and the ledger add ≤ 0.1 ms at p50 and lose no requests/s at
concurrency 32. Loopback only; ends by itself. ``--code DIR`` runs every side from another
checkout (``git worktree add DIR COMMIT``), ``--keys-code DIR`` only the keyed side, to see
what a change did.

    .venv/bin/python benchmarks/tenancy_overhead.py [--rounds 5] [--requests 500] [--seconds 3]
    .venv/bin/python benchmarks/tenancy_overhead.py --instructions   # needs valgrind; minutes
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from starlette.datastructures import Headers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import ledger_writes
from benchmarks.harness import BenchServer, check_sides, coordinator_side, wait_for
from benchmarks.proxy_overhead import (
    GPU,
    KEY,
    latencies,
    loaded,
    request_bytes,
    start_upstream,
    throughput,
    up,
)
from model_boss.api.middleware.keys import KeyAdmission, check_key, given_key, identity
from model_boss.settings import ClientProfile, Settings
from model_boss.tenancy.keys import KeyStore, MinuteWindows, with_identity
from model_boss.tenancy.usage import UsageRow
from model_boss.tenancy.usage.totals import HourlyTotals

ADMIN_KEY = "bench-admin"
# every limit a key can have, far above what a run uses: each is checked on every request
LIMITS = {"requests_per_minute": 10**9, "tokens_per_minute": 10**12, "tokens_per_day": 10**12,
          "tokens_per_month": 10**13, "images_per_day": 10**9,
          "audio_seconds_per_day": 10**9, "gpu_seconds_per_day": 10**9,
          "gpu_seconds_per_month": 10**10, "max_concurrency": 1000}
SIDES = {"open": {"usage_ledger": False}, "ledger": {"usage_ledger": True},
         "keys": {"usage_ledger": True, "admin_api_key": ADMIN_KEY}}
GOAL_ADDED_MS = 0.1


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=500,
                        help="sequential requests for the concurrency-1 latency, per round")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="duration of each throughput run")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--ledger-rows", type=int, default=50_000)
    parser.add_argument("--code", type=Path,
                        help="run every side from this checkout (a commit's worktree)")
    parser.add_argument("--keys-code", type=Path,
                        help="run the keyed side from this checkout (an older commit's "
                             "worktree: what a change did)")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per request in one process (valgrind)")
    parser.add_argument("--in-process", nargs=2, metavar=("SIDE", "N"),
                        help=argparse.SUPPRESS)  # one counted run (what --instructions starts)
    return parser.parse_args()


def managed_key(server: BenchServer) -> str:
    """The keyed side's managed key, with every limit."""
    answer = httpx.post(server.url + "/api/v1/keys", timeout=10,
                        headers={"authorization": f"Bearer {ADMIN_KEY}"},
                        json={"name": "tenant", "models": ["claude:*"], **LIMITS})
    answer.raise_for_status()
    return answer.json()["key"]


def ledger_rows(server: BenchServer) -> int:
    """Requests the keyed side's ledger holds (a query writes what waits first)."""
    answer = httpx.get(server.url + "/api/v1/usage?group_by=key", timeout=30,
                       headers={"authorization": f"Bearer {ADMIN_KEY}"})
    answer.raise_for_status()
    return sum(row["requests"] for row in answer.json()["rows"])


async def measure(args: argparse.Namespace, servers: dict[str, BenchServer],
                  payloads: dict[str, bytes]) -> dict[str, dict[str, list[float]]]:
    """Each side's figures, one per round, the sides in turns."""
    figures: dict[str, dict[str, list[float]]] = {
        side: {"p50_ms": [], "rps": [], "cpu_ms": []} for side in servers}
    for side, server in servers.items():  # warm every path (connections, caches)
        await latencies(server.port, payloads[side], 200)
        await throughput(server.port, payloads[side], args.concurrency, 0.5)
    for round_no in range(args.rounds):
        order = list(servers) if round_no % 2 == 0 else list(reversed(servers))
        for side in order:
            server = servers[side]
            assert server.proc is not None
            lat = await latencies(server.port, payloads[side], args.requests)
            rps, cpu = await loaded(psutil.Process(server.proc.pid), server.port,
                                    payloads[side], args.concurrency, args.seconds)
            figures[side]["p50_ms"].append(statistics.median(lat) * 1000)
            figures[side]["rps"].append(rps)
            figures[side]["cpu_ms"].append(cpu)
        print(f"  round {round_no + 1}: " + "  ".join(
            f"{side} {figures[side]['p50_ms'][-1]:.3f} ms {figures[side]['rps'][-1]:,.0f}/s "
            f"{figures[side]['cpu_ms'][-1]:.3f} cpu-ms" for side in servers), flush=True)
    return figures


def cell(values: list[float], digits: int) -> str:
    return (f"{statistics.median(values):,.{digits}f} "
            f"({min(values):,.{digits}f}–{max(values):,.{digits}f})")


async def edge_cpu_us(repeats: int = 5, per_run: int = 5000) -> float:
    """CPU µs the keyed edge spends on one request, in this process (median of runs): what
    api/middleware/identity.py and admission.py do with a managed key before the request goes
    on."""
    store = KeyStore(Settings(admin_api_key=ADMIN_KEY, tasks_file=None), None)
    profile = ClientProfile(**{k: v for k, v in LIMITS.items() if k != "max_concurrency"})
    record, secret = await store.create("tenant", profile)
    windows, totals = MinuteWindows(), HourlyTotals()
    now = time.time()
    for i in range(6000):  # a minute at 100 requests/s, and 30 days of hours
        windows.admitted(record.name, now - 59 + i / 100)
        windows.used(record.name, now - 59 + i / 100, 40)
        totals.add(UsageRow(key=record.name, end_user="", model="m", endpoint="chat",
                            outcome="ok", http_status=200, at=now - i * 432, prompt_tokens=40))
    admission = KeyAdmission(windows, totals.spent)
    raw = [(b"host", b"127.0.0.1:8080"), (b"authorization", b"Bearer " + secret.encode()),
           (b"content-type", b"application/json"), (b"content-length", b"80")]
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "headers": raw}

    def one() -> None:
        checked = check_key(given_key(Headers(scope=scope)), store, admin=False)
        assert checked.record is not None
        who = identity(checked, Headers(scope=scope))
        assert admission.admit(checked.record, scope["path"]) is None
        with_identity(scope, who)

    runs = []
    for _ in range(repeats):
        started = time.process_time()
        for _ in range(per_run):
            one()
        runs.append((time.process_time() - started) / per_run * 1e6)
    return statistics.median(runs)


def print_table(args: argparse.Namespace, figures: dict[str, dict[str, list[float]]],
                rows_s: float, written: int, edge_us: float) -> None:
    open_, keys = figures["open"], figures["keys"]
    added = statistics.median(keys["p50_ms"]) - statistics.median(open_["p50_ms"])
    rps_ratio = statistics.median(keys["rps"]) / statistics.median(open_["rps"])
    print(f"\nProxied chat completion (cloud manifest over tests/fake_upstream.py); "
          f"{args.rounds} rounds in turns, median (range); {args.requests} sequential "
          f"requests, {args.seconds:g}s at concurrency {args.concurrency} a round\n")
    print("| measurement | open (no keys, no ledger) | ledger (no keys) | keys + limits + "
          "ledger | keys vs open | goal | met |")
    print("|---|---:|---:|---:|---:|---|---|")
    print(f"| p50 latency, concurrency 1 (ms) | {cell(open_['p50_ms'], 3)} | "
          f"{cell(figures['ledger']['p50_ms'], 3)} | {cell(keys['p50_ms'], 3)} | "
          f"{added:+.3f} ms | ≤ +{GOAL_ADDED_MS} ms | "
          f"{'yes' if added <= GOAL_ADDED_MS else 'MISS'} |")
    print(f"| requests/s, concurrency {args.concurrency} | {cell(open_['rps'], 0)} | "
          f"{cell(figures['ledger']['rps'], 0)} | {cell(keys['rps'], 0)} | "
          f"×{rps_ratio:.3f} | none lost | {'yes' if rps_ratio >= 1 else 'MISS'} |")
    cpu_added = statistics.median(keys["cpu_ms"]) - statistics.median(open_["cpu_ms"])
    print(f"| coordinator CPU per request, conc. {args.concurrency} (ms) | "
          f"{cell(open_['cpu_ms'], 3)} | {cell(figures['ledger']['cpu_ms'], 3)} | "
          f"{cell(keys['cpu_ms'], 3)} | {cpu_added:+.3f} ms | - | - |")
    goal_us = GOAL_ADDED_MS * 1000
    print(f"| keyed edge, CPU per request in-process (µs) | - | - | {edge_us:.1f} | - | "
          f"≤ {goal_us:.0f} | {'yes' if edge_us <= goal_us else 'MISS'} |")
    print(f"| ledger rows on disk per second (ledger_writes.py, background writer) | - | - | "
          f"{rows_s:,.0f} | - | ≥ {ledger_writes.GOAL_ROWS_S:,} | "
          f"{'yes' if rows_s >= ledger_writes.GOAL_ROWS_S else 'MISS'} |")
    print(f"\nthe keyed side's ledger holds {written:,} requests")


async def ledger_rate(rows: int) -> float:
    """benchmarks/ledger_writes.py's figure: rows/s on disk with the background writer."""
    batch = ledger_writes.rows(rows)
    settings = argparse.Namespace(flush_s=0.25, batch=1000)
    with tempfile.TemporaryDirectory() as folder:
        result = await ledger_writes.one_run(Path(folder) / "usage.sqlite3", batch, settings,
                                             "background writer")
    return result["rows_s"]


# the in-process sides: settings, and the key's limits (None: no key)
IN_PROCESS = {"open": ({"usage_ledger": False}, None), "ledger": ({}, None),
              "key": ({"admin_api_key": ADMIN_KEY}, {}),
              "key + limits": ({"admin_api_key": ADMIN_KEY}, LIMITS)}
COUNTED = (40, 240)  # requests per counted run: the difference is what requests cost


async def serve_in_process(side: str, count: int) -> None:
    """``count`` chat completions through the app in this process (a fake worker that says
    its usage), 4 at a time; the usage written before the end."""
    from tests.unit.fakes import coordinator, manifest, started_client

    settings, limits = IN_PROCESS[side]
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "ping"}]}
    with tempfile.TemporaryDirectory() as tmp:
        coord, _ = coordinator(Path(tmp), [manifest("m", 1000)],
                               backend_kwargs={"tokens": 5}, **settings)
        async with started_client(coord) as client:
            headers = {}
            if limits is not None:
                _, secret = await coord.keys.create("tenant", ClientProfile(**limits))
                headers = {"authorization": f"Bearer {secret}"}

            async def one_client(requests: int) -> None:
                for _ in range(requests):
                    answer = await client.post("/v1/chat/completions", json=body,
                                               headers=headers)
                    answer.raise_for_status()

            await asyncio.gather(*(one_client(count // 4) for _ in range(4)))
            await coord.usage.flush()


def count_instructions() -> dict[str, float]:
    """Instructions per request of each in-process side (valgrind's count)."""
    per_request = {}
    for side in IN_PROCESS:
        counts = []
        for count in COUNTED:
            run = subprocess.run(
                ["valgrind", "--tool=cachegrind", "--cache-sim=no",
                 "--cachegrind-out-file=/dev/null", sys.executable, __file__,
                 "--in-process", side, str(count)], capture_output=True, text=True, check=True)
            found = re.search(r"I\s+refs:\s+([\d,]+)", run.stderr)
            assert found is not None, run.stderr[-2000:]
            counts.append(int(found.group(1).replace(",", "")))
        per_request[side] = (counts[1] - counts[0]) / (COUNTED[1] - COUNTED[0])
        print(f"  {side}: {per_request[side]:,.0f} instructions a request", flush=True)
    return per_request


def print_instructions(per_request: dict[str, float]) -> None:
    base = per_request["open"]
    print(f"\nInstructions per chat completion through the app in one process (client "
          f"included), {COUNTED[1]} less {COUNTED[0]} requests\n")
    print("| side | instructions a request | added to open |")
    print("|---|---:|---:|")
    for side, value in per_request.items():
        print(f"| {side} | {value:,.0f} | {value - base:+,.0f} ({value / base - 1:+.1%}) |")


def main() -> None:
    args = parse_args()
    if args.in_process:
        asyncio.run(serve_in_process(args.in_process[0], int(args.in_process[1])))
        return
    if args.instructions:
        print_instructions(count_instructions())
        return
    upstream: subprocess.Popen | None = None
    servers: dict[str, BenchServer] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            upstream, up_port = start_upstream()
            wait_for(lambda: up(up_port), timeout=20)
            manifest = {"id": "claude:fake", "backend": "cloud", "category": "llm",
                        "base_url": f"http://127.0.0.1:{up_port}/v1",
                        "api_key_env": "BENCH_UPSTREAM_KEY", "remote_model": "remote-x"}
            for side, settings in SIDES.items():
                servers[side] = BenchServer(Path(tmp) / side,
                                            {"log_level": "WARNING", **GPU, **settings},
                                            [manifest], env={"BENCH_UPSTREAM_KEY": KEY})
                code = args.keys_code if side == "keys" and args.keys_code else args.code
                if code is not None:
                    servers[side].checkout = code.resolve()
                servers[side].start()
            secret = managed_key(servers["keys"])
            payloads = {side: request_bytes(server.port, "claude:fake",
                                            key=secret if side == "keys" else None)
                        for side, server in servers.items()}
            check_sides({side: coordinator_side(server, key=LIMITS if side == "keys" else None)
                         for side, server in servers.items()},
                        measured=["usage_ledger", "admin_api_key", "key",
                                  *(["code"] if args.keys_code else [])])
            figures = asyncio.run(measure(args, servers, payloads))
            written = ledger_rows(servers["keys"])
            for server in servers.values():
                server.stop()
            servers.clear()
            rows_s = asyncio.run(ledger_rate(args.ledger_rows))
            edge_us = asyncio.run(edge_cpu_us())
    finally:
        for server in servers.values():
            server.stop()
        if upstream is not None:
            upstream.terminate()
            upstream.wait(10)
    print_table(args, figures, rows_s, written, edge_us)


if __name__ == "__main__":
    main()
