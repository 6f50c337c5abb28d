"""Request traces for the simulator: seeded synthetic ones and the coordinator's request log.

The request log (``state_dir/requests.jsonl``, written by :class:`~.request_log.RequestLog`)
has one JSON object per finished request: ``timestamp`` (arrival), ``model``, ``priority``,
``duration``, ``client_id``, ``size_mb`` and, when measured, ``load_s``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from ..errors import BadRequest
from .simulator import SimRequest, Trace


def workshop_trace(seed: int, count: int = 400) -> Trace:
    """3–6 models of mixed sizes, Zipf-ish popularity, sessions that switch often."""
    rng = random.Random(seed)
    n = rng.randint(3, 6)
    models = [f"m{i}" for i in range(n)]
    sizes = {m: rng.choice([2048, 4096, 6144, 9216, 12288]) for m in models}
    weights = [1 / (i + 1) for i in range(n)]
    requests: list[SimRequest] = []
    t, session = 0.0, 0
    while len(requests) < count:
        model = rng.choices(models, weights)[0]
        session += 1
        for _ in range(rng.randint(1, 4)):  # a participant's short session
            t += rng.expovariate(1 / 8.0)
            requests.append(SimRequest(t, model, 5, rng.uniform(1, 6), f"user{session % 8}"))
    return Trace(f"workshop (seed {seed})", requests[:count], sizes, 16384)


def bursty_trace(seed: int, count: int = 400) -> Trace:
    """Interactive (0), normal (5) and batch (9) clients in bursts on different models."""
    rng = random.Random(seed + 1000)
    sizes = {"chat-small": 3072, "chat-big": 9216, "coder": 7168, "image": 12288,
             "batch-big": 14336}
    classes = [(0, ["chat-small", "chat-big"], 0.45), (5, ["coder", "image"], 0.35),
               (9, ["batch-big", "image"], 0.20)]
    requests: list[SimRequest] = []
    t, burst = 0.0, 0
    while len(requests) < count:
        priority, models, _ = rng.choices(classes, [c[2] for c in classes])[0]
        model = rng.choice(models)
        burst += 1
        for _ in range(rng.randint(1, 6)):
            t += rng.expovariate(1 / 6.0)
            duration = rng.uniform(0.5, 3) if priority == 0 else rng.uniform(2, 8)
            requests.append(SimRequest(t, model, priority, duration,
                                       f"p{priority}-client{burst % 3}"))
    return Trace(f"bursty multi-client (seed {seed})", requests[:count], sizes, 24576)


def burst_trace(seed: int, count: int = 300) -> Trace:
    """One 13 GB chat model: a request every ~30 s, and bursts of 10–40 a second apart."""
    rng = random.Random(seed + 2000)
    requests: list[SimRequest] = []
    t = 0.0
    while len(requests) < count:
        for _ in range(rng.randint(3, 8)):  # the quiet part
            t += rng.expovariate(1 / 30.0)
            requests.append(SimRequest(t, "chat", 5, rng.uniform(2, 8)))
        for _ in range(rng.randint(10, 40)):  # a burst
            t += rng.expovariate(1.0)
            requests.append(SimRequest(t, "chat", 5, rng.uniform(2, 8)))
    return Trace(f"burst (seed {seed})", requests[:count], {"chat": 13312}, 24576)


def jsonl_trace(path: Path, capacity_mb: int) -> Trace:
    """A request log as a trace; arrivals start at 0. A clear error for a bad line."""
    requests: list[SimRequest] = []
    sizes: dict[str, int] = {}
    loads: dict[str, float] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            model = str(item["model"])
            requests.append(SimRequest(float(item["timestamp"]), model,
                                       int(item.get("priority", 5)), float(item["duration"]),
                                       str(item.get("client_id") or "anonymous")))
            sizes[model] = int(item.get("size_mb") or sizes.get(model, 4096))
            if item.get("load_s"):
                loads[model] = float(item["load_s"])
        except (ValueError, KeyError, TypeError) as exc:
            raise BadRequest(f"{path.name}:{number}: not a request log line ({exc})") from exc
    if not requests:
        raise BadRequest(f"{path.name}: no requests in the log")
    start = min(r.arrival for r in requests)
    for r in requests:
        r.arrival -= start
    return Trace(f"log {path.name}", sorted(requests, key=lambda r: r.arrival), sizes,
                 capacity_mb, loads)
