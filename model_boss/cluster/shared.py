"""State the members share beyond routing: the runtime config and learned measurements.

- **Runtime config.** It already lives in one Redis key every member reads at start. A change
  on one member (``config_changed``) sends a notice; the others then read the key, so the
  change is in effect everywhere within a notice's delivery.
- **Learned figures.** Measured VRAM, cold-load and inference seconds are written to a
  shared hash (after each load and measurement, and every few heartbeats); a member takes
  the figures it has not measured itself at start and on each sync, so a new member starts
  with the others' measurements instead of estimates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import asdict
from typing import Any

from ..errors import StoreUnavailable
from ..runtime_config import RuntimeConfig
from ..scheduling.learned import LearnedStats
from .membership import Membership
from .store import ClusterStore

log = logging.getLogger(__name__)

LEARNED_EVENTS = frozenset({"loaded", "measured"})


def merge_learned(stats: LearnedStats, shared: dict[str, dict[str, Any]]) -> list[str]:
    """Take the shared figures this member lacks; returns the models that gained any."""
    gained = []
    for model, figures in shared.items():
        local = stats.get(model)
        before = asdict(local)
        if local.vram_mb is None and figures.get("vram_mb") is not None:
            local.vram_mb = int(figures["vram_mb"])
        if local.load_s is None and figures.get("load_s") is not None:
            local.load_s = float(figures["load_s"])
            local.loads = int(figures.get("loads") or 0)
        if local.infer_s is None and figures.get("infer_s") is not None:
            local.infer_s = float(figures["infer_s"])
            local.requests = int(figures.get("requests") or 0)
        if asdict(local) != before:
            gained.append(model)
    return gained


def own_figures(stats: LearnedStats) -> dict[str, dict[str, Any]]:
    """The figures this member measured itself (what it shares)."""
    return {model: asdict(s) for model, s in stats.models.items()
            if s.loads or s.requests or s.vram_mb is not None}


class SharedState:
    """Runtime config notices and the learned figures' sync for one member."""

    def __init__(self, store: ClusterStore, membership: Membership, runtime: RuntimeConfig,
                 learned: LearnedStats, *, sync_every_s: float) -> None:
        self.store = store
        self.membership = membership
        self.runtime = runtime
        self.learned = learned
        self.sync_every_s = sync_every_s
        self._dirty = asyncio.Event()
        self._stopping = False  # the loop's own end: a cancel can be lost (membership.py)
        self._tasks: set[asyncio.Task] = set()
        self._loop: asyncio.Task | None = None
        membership.on_notice("config", lambda _notice: self._spawn(self.runtime.reload()))

    def on_event(self, event: dict) -> None:
        kind = event.get("type")
        if kind == "config_changed":
            self._spawn(self.store.notify("config", self.membership.host_id))
        elif kind in LEARNED_EVENTS:
            self._dirty.set()

    async def start(self) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.sync()
        self._loop = asyncio.create_task(self._sync_loop(), name="cluster-learned")

    async def sync(self) -> None:
        """Share what was measured here; take what others measured that this member lacks."""
        await self.store.share_learned(own_figures(self.learned))
        gained = merge_learned(self.learned, await self.store.learned())
        if gained:
            log.info("learned figures from other members for: %s", ", ".join(gained))

    async def _sync_loop(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), self.sync_every_s)
            self._dirty.clear()
            if self._stopping:
                return
            try:
                await self.sync()
            except StoreUnavailable as exc:
                log.warning("learned figures not shared: %s", exc.message)
            except Exception:  # the loop never dies
                log.exception("learned figures not shared")

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("cluster: %s", task.exception())

    async def stop(self) -> None:
        self._stopping = True
        self._dirty.set()  # wakes the loop, which then ends by itself if the cancel is lost
        tasks = [*self._tasks, *([self._loop] if self._loop else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        with contextlib.suppress(StoreUnavailable):
            await self.store.share_learned(own_figures(self.learned))
