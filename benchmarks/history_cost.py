"""What the dashboard's history costs: RAM for a full hour, and the page's reads with it full.

One coordinator (two declared GPUs, no models) served by uvicorn on a free port, read as the
page reads it (``/ui/`` with its embedded snapshot, ``/api/v1/history``, ``/api/v1/requests``,
``/api/v1/status``, ``/api/v1/queue``, ``/api/v1/events``): first empty (the baseline), then
with the history filled to the hour it keeps (one step every ``--step-s``, eight holders on
each GPU, ten models, five priorities), 1,000 loads and evictions marked, 1,000 finished
requests in the ring and 1,000 events on the bus. RAM is what tracemalloc sees the filling
allocate. Goals: a few MB for the hour; no read over 100 ms on an idle box.

    .venv/bin/python benchmarks/history_cost.py [--step-s 5] [--rounds 30]
"""

from __future__ import annotations

import argparse
import math
import socket
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from model_boss.coordinator import Coordinator
from model_boss.observability.history.timeline import KEEP_S, Step
from model_boss.settings import Settings

READS = ("/ui/", "/api/v1/history", "/api/v1/requests?limit=100", "/api/v1/status",
         "/api/v1/queue?limit=100", "/api/v1/events?stream=false")
EVENTS = 1000
MODELS = [f"model-{n}" for n in range(10)]


def fill_steps(coord: Coordinator, step_s: float) -> None:
    """An hour of steps."""
    history = coord.history
    now = time.time()
    steps = math.ceil(KEEP_S / step_s) + 1
    for i in range(steps):
        held = {gpu: {f"model:{m}": 1000 + 10 * (i % 7) for m in MODELS[gpu * 4:gpu * 4 + 6]}
                | {f"lease:trainer-{gpu}-{k}": 500 for k in range(2)} for gpu in (0, 1)}
        history.steps.append(Step(
            t=round(now - (steps - i) * step_s, 3), held=held, free={0: 2048, 1: 1024},
            depth={str(p): i % 9 for p in range(0, 10, 2)},
            wait={str(p): 0.25 * (i % 5) for p in range(0, 10, 2)},
            requests={m: 1.5 for m in MODELS}, tokens={m: 42.0 for m in MODELS},
            cpu_tier_mb=4096))


def fill_rest(coord: Coordinator) -> None:
    """1,000 marks, 1,000 request rows and 1,000 events."""
    history, now = coord.history, time.time()
    for n in range(EVENTS):
        model = MODELS[n % len(MODELS)]
        kind = ("loaded", "evicted")[n % 2]
        event = coord.events.emit(kind, model=model, reason=f"room for {MODELS[(n + 1) % 10]}")
        history.on_event(event)
        coord.requests.write(model=model, priority=n % 10, duration=0.4, size_mb=1000,
                             client_id=f"client-{n % 16}", ok=True, submitted_at=now - 2,
                             tokens=64, extra={"load_wait_s": 0.5, "task": "chat", "rung": 0,
                                               "endpoint": "/v1/chat/completions"})


def settings(workdir: Path) -> Settings:
    return Settings(manifests=[], tasks_file=None, discover=False, watch=False,
                    models_dir=workdir / "models", state_dir=workdir / "state", use_nvml=False,
                    request_log=False,
                    gpus=[{"index": 0, "name": "sim-24g", "vram_mb": 24576},
                          {"index": 1, "name": "sim-24g", "vram_mb": 24576}])


class Served:
    """The coordinator's app under uvicorn in a thread, on a free port."""

    def __init__(self, coord: Coordinator) -> None:
        import uvicorn

        from model_boss.api.app import create_app

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(create_app(coordinator=coord),
                                                    host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        url = f"http://127.0.0.1:{self.port}"
        for _ in range(200):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    return url
            except httpx.HTTPError:
                time.sleep(0.05)
        raise SystemExit("the coordinator did not start")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def timed_reads(url: str, rounds: int) -> dict[str, list[float]]:
    """Each read ``rounds`` times, in turns: milliseconds, and the answer's size."""
    seen: dict[str, list[float]] = {path: [] for path in READS}
    sizes: dict[str, int] = {}
    with httpx.Client(base_url=url, timeout=30) as client:
        for path in READS:
            client.get(path)  # warm
        for _ in range(rounds):
            for path in READS:
                started = time.perf_counter()
                answer = client.get(path)
                seen[path].append((time.perf_counter() - started) * 1000)
                assert answer.status_code == 200, (path, answer.status_code)
                sizes[path] = len(answer.content)
    return {path: [*times, sizes[path]] for path, times in seen.items()}


def allocated_mb(fill, *args) -> float:
    """What ``fill(*args)`` leaves allocated, in MB."""
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    fill(*args)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    return sum(s.size_diff for s in after.compare_to(before, "filename")) / 2**20


def run(step_s: float, rounds: int, full: bool) -> tuple[dict, tuple[float, float]]:
    with tempfile.TemporaryDirectory(prefix="history-cost-") as tmp:
        coord = Coordinator(settings(Path(tmp)).model_copy(update={"history_step_s": step_s}))
        ram_mb = (0.0, 0.0)
        if full:  # before it serves: nothing else allocates meanwhile
            ram_mb = (allocated_mb(fill_steps, coord, step_s), allocated_mb(fill_rest, coord))
        with Served(coord) as url:
            return timed_reads(url, rounds), ram_mb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step-s", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    empty, _ = run(args.step_s, args.rounds, full=False)
    full, ram_mb = run(args.step_s, args.rounds, full=True)
    steps = math.ceil(KEEP_S / args.step_s) + 1
    print(f"\nThe dashboard's reads, {args.rounds} rounds in turns, empty vs an hour of history "
          f"({steps} steps of {args.step_s:g} s, 2 GPUs x 8 holders, 10 models), "
          f"{EVENTS:,} marks, {EVENTS:,} requests, {EVENTS:,} events. RAM: the hour of steps "
          f"{ram_mb[0]:.1f} MB, the marks, requests and events {ram_mb[1]:.1f} MB\n")
    print("| read | answer KB (full) | median ms (empty) | median ms (full) | max ms (full) "
          "| × empty |")
    print("|---|---|---|---|---|---|")
    for path in READS:
        e_times, f_times = empty[path][:-1], full[path][:-1]
        e_med, f_med = statistics.median(e_times), statistics.median(f_times)
        print(f"| `{path}` | {full[path][-1] / 1024:.0f} | {e_med:.1f} | {f_med:.1f} | "
              f"{max(f_times):.1f} | {f_med / e_med:.2f}× |")


if __name__ == "__main__":
    main()
