"""History: the coordinator's last hour, one step every ``history_step_s``, as the series the
dashboard's timelines draw (``GET /api/v1/history``)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...slot_key import model_of, slot_key

if TYPE_CHECKING:
    from ...gpu import GPUBoss
    from ...scheduling.queue import InferenceQueue
    from ...slots.pool import ModelPool

log = logging.getLogger(__name__)

KEEP_S = 3600.0  # the last hour
MAX_MARKS = 2000
MAX_POINTS = 720  # per series in an answer: finer than a chart's pixels is wasted
# event type → mark type; an "unloaded" that is part of an eviction is marked by "evicted"
MARKS = {"loaded": "load", "evicted": "evict", "unloaded": "unload", "offloaded": "offload",
         "onloaded": "onload", "oom_retry": "oom_retry", "worker_crashed": "crash",
         "lease_lost": "lease_lost"}
IDLE_REASON = "stay-warm expired"  # the reaper's unload: an eviction for idleness


@dataclass
class Step:
    """One sample: what was held and free on each GPU, the queue, and the step's counts."""

    t: float
    held: dict[int, dict[str, int]]  # gpu → holder label → MB
    free: dict[int, int]
    depth: dict[str, int]  # priority → requests waiting
    wait: dict[str, float]  # priority → mean wait of the requests granted in the step
    requests: dict[str, float]  # model → requests finished per second
    tokens: dict[str, float]  # model → tokens per second
    cpu_tier_mb: int


@dataclass
class _Counts:
    granted: dict[str, list[float]] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)


class History:
    """Samples the boss, the pool and the queue every ``step_s`` (a bounded deque: the last
    hour), counts grants and finished requests between samples, and keeps marks from the
    event bus. :meth:`sample` is the one writer of the steps; :meth:`render` reads them."""

    def __init__(self, boss: GPUBoss, pool: ModelPool, queue: InferenceQueue,
                 step_s: float) -> None:
        self.boss, self.pool, self.queue = boss, pool, queue
        self.step_s = step_s
        self.steps: deque[Step] = deque(maxlen=math.ceil(KEEP_S / step_s) + 1)
        self.marks: deque[dict[str, Any]] = deque(maxlen=MAX_MARKS)
        # index → (name, capacity MB): the inventory until the first sample says otherwise
        self._gpus = {g.index: (g.name, g.vram_mb) for g in boss.gpus}
        self._gpu_of: dict[str, int] = {}  # model → the GPU it was last seen on
        self._counts = _Counts()

    # -- feeds ---------------------------------------------------------------------------

    def granted(self, priority: int, waited_s: float) -> None:
        self._counts.granted.setdefault(str(priority), []).append(waited_s)

    def finished(self, row: dict[str, Any]) -> None:
        """A finished request (a :class:`~.requests.RequestRing` row)."""
        model = row["model"]
        self._counts.requests[model] = self._counts.requests.get(model, 0) + 1
        if row.get("tokens"):
            self._counts.tokens[model] = self._counts.tokens.get(model, 0) + row["tokens"]

    def on_event(self, event: dict[str, Any]) -> None:
        kind = MARKS.get(event["type"])
        if kind is None:
            return
        model, reason = event.get("model"), event.get("reason")
        if kind == "unload" and str(reason or "").startswith("evicted: "):
            return  # the "evicted" event that follows marks it
        if kind == "unload" and reason == IDLE_REASON:
            kind, reason = "evict", "idle"
        elif kind == "evict":
            self._drop_offload_of(model, reason)  # an eviction to the CPU tier: one mark
            reason = str(reason or "")
            reason = "for " + reason[len("room for "):] if reason.startswith("room for ") \
                else reason or None
        elif kind == "crash" and event.get("code") is not None:
            reason = f"{reason} (exit {event['code']})" if reason else f"exit {event['code']}"
        self.marks.append({"t": event.get("ts", time.time()), "type": kind, "model": model,
                           "gpu": self._gpu(model), "reason": reason})

    def _drop_offload_of(self, model: str | None, reason: str | None) -> None:
        for mark in reversed(self.marks):
            if mark["type"] == "offload" and mark["model"] == model and mark["reason"] == reason:
                self.marks.remove(mark)
                return

    def _gpu(self, model: str | None) -> int | None:
        slot = self.pool.slots.get(slot_key(model)) if model else None  # its first copy
        lease = getattr(slot, "lease", None)
        if lease is not None and lease.allocations:
            self._gpu_of[model] = min(lease.allocations)  # type: ignore[index]
        return self._gpu_of.get(model) if model else None

    # -- sampling ------------------------------------------------------------------------

    async def run(self) -> None:
        """Background loop: one sample every ``step_s``. Never dies."""
        while True:
            await asyncio.sleep(self.step_s)
            try:
                await self.sample()
            except Exception:
                log.exception("history sample failed; carrying on")

    async def sample(self, now: float | None = None) -> Step:
        usage = await self.boss.usage()
        leases = await self.boss.leases()
        held: dict[int, dict[str, int]] = {u.index: {} for u in usage}
        for lease in leases:
            own = lease.holder == self.boss.holder and lease.kind == "inference" and lease.note
            label = f"model:{lease.note}" if own else f"lease:{lease.holder}"
            for gpu, mb in lease.allocations.items():
                series = held.setdefault(gpu, {})
                series[label] = series.get(label, 0) + mb
                if own:
                    self._gpu_of.setdefault(lease.note, gpu)
        self._gpus = {u.index: (u.name, u.capacity_mb) for u in usage}
        counts, self._counts = self._counts, _Counts()
        step = Step(
            t=round(time.time() if now is None else now, 3), held=held,
            free={u.index: u.free_mb for u in usage},
            depth={str(p): n for p, n in self.queue.backlog.by_priority().items()},
            wait={p: round(sum(w) / len(w), 4) for p, w in counts.granted.items()},
            requests={m: round(n / self.step_s, 4) for m, n in counts.requests.items()},
            tokens={m: round(n / self.step_s, 4) for m, n in counts.tokens.items()},
            cpu_tier_mb=self.pool.offloaded_mb())
        for key in self.pool.slots:  # rates are per model: a copy past the first adds none
            step.requests.setdefault(model_of(key), 0.0)
        self.steps.append(step)
        return step

    # -- reading -------------------------------------------------------------------------

    def render(self, minutes: float = 60, now: float | None = None,
               points: int = MAX_POINTS) -> dict[str, Any]:
        """The last ``minutes`` as aligned series (oldest first); absent holders read 0. More
        steps than ``points`` are averaged in equal runs (``step_s`` says the run's length),
        so the answer stays the size a chart can draw whatever the step."""
        now = time.time() if now is None else now
        since = now - minutes * 60
        steps = [s for s in self.steps if s.t >= since]
        run = max(1, math.ceil(len(steps) / max(1, points)))
        if run > 1:
            return _averaged(self._render(steps, now, since), run)
        return self._render(steps, now, since)

    def _render(self, steps: list[Step], now: float, since: float) -> dict[str, Any]:
        gpus = {}
        for index, (name, capacity) in sorted(self._gpus.items()):
            per_step = [s.held.get(index, {}) for s in steps]
            labels = sorted({label for held in per_step for label in held})
            gpus[str(index)] = {
                "name": name, "capacity_mb": capacity,
                "held": {label: [held.get(label, 0) for held in per_step] for label in labels},
                "free_mb": [s.free.get(index, 0) for s in steps]}
        priorities = sorted({p for s in steps for p in (*s.depth, *s.wait)}, key=int)
        models = sorted({m for s in steps for m in (*s.requests, *s.tokens)})
        return {
            "step_s": self.step_s, "now": now, "t": [s.t for s in steps], "gpus": gpus,
            "queue": {"depth": {p: [s.depth.get(p, 0) for s in steps] for p in priorities},
                      "wait_s": {p: [s.wait.get(p) for s in steps] for p in priorities}},
            "models": {m: {"requests_per_s": [s.requests.get(m, 0.0) for s in steps],
                           "tokens_per_s": [s.tokens.get(m, 0.0) for s in steps]}
                       for m in models},
            "cpu_tier_mb": [s.cpu_tier_mb for s in steps],
            "marks": [dict(m) for m in self.marks if m["t"] >= since]}


def _mean(values: list) -> Any:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 4) if known else None


def _averaged(rendered: dict[str, Any], run: int) -> dict[str, Any]:
    """Every series of ``rendered`` averaged over runs of ``run`` steps (nulls ignored)."""
    def series(values: list) -> list:
        if not values:
            return values
        if None in values:
            return [_mean(values[i:i + run]) for i in range(0, len(values), run)]
        sums = [sum(values[i:i + run]) for i in range(0, len(values), run)]
        last = len(values) - run * (len(sums) - 1)  # the last run may be shorter
        return [round(total / run, 4) for total in sums[:-1]] + [round(sums[-1] / last, 4)]

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return series(node)
        if isinstance(node, dict):
            return {key: walk(value) for key, value in node.items()}
        return node

    marks = rendered.pop("marks")
    averaged = {key: walk(value) for key, value in rendered.items()}
    averaged["step_s"] = rendered["step_s"] * run
    averaged["marks"] = marks
    return averaged
