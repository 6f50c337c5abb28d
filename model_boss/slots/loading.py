"""SlotLoad: one load of a slot, run as its owner's operation.

Room first (the pool carries out the planner's plan and hands back a lease), then either a cold
start of a new worker or an onload of the parked one; READY only if the lease is still the
slot's and the worker still alive. A failure stops whatever was started and releases the lease.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from typing import TYPE_CHECKING

from ..backends.base import InferenceBackend
from ..backends.processes import free_port
from ..errors import LoadFailed, ModelBossError
from ..gpu.lease import Lease
from ..gpu.placement import Placement
from .progress import LoadProgress
from .slot import SlotState

if TYPE_CHECKING:
    from .host import SlotOperator

S = SlotState
# a worker's words for running out of GPU memory while it loads (llama.cpp, CUDA, torch)
OUT_OF_MEMORY = re.compile(r"out of memory|OutOfMemoryError|failed to allocate|"
                           r"CUBLAS_STATUS_ALLOC_FAILED|cudaMalloc failed", re.IGNORECASE)
OOM_RETRIES = 1  # loads again once with a larger claim, then fails as it would have
OOM_GROWTH = 1.25


class SlotLoad:
    """Makes ``owner``'s slot READY for a request of ``priority``; only its owner runs it.

    Its stages go out as ``load_progress`` events. Its owner may cancel it (nobody waits for
    it any more) while ``cancellable``: during room-making and a cold start, never once it is
    cleaning up after a failure, nor during an onload (a second or so)."""

    def __init__(self, owner: SlotOperator, priority: int) -> None:
        self.owner = owner
        self.priority = priority
        self.progress = LoadProgress(owner.pool.events, owner.model_id)
        self.cancellable = True
        self.cancel_reason: str | None = None

    async def run(self) -> None:
        s, priority = self.owner.slot, self.priority
        try:
            for attempt in range(1 + OOM_RETRIES):
                self.progress.report("leasing")
                entry = self.owner.pool.catalog.get_available(self.owner.model_id)
                s.entry = entry  # a reload's new manifest applies from this load on
                s.estimate = self.owner.pool.estimate(entry)
                lease, placement = await self.owner.pool.make_room(self.owner, priority)
                if s.state == S.OFFLOADED and not _sees(s.worker_gpus, placement):
                    await self._retire_parked(lease, placement)
                if s.state == S.OFFLOADED:  # the worker may have died meanwhile: a cold load
                    await self._onload(lease, placement, priority)
                    break
                try:
                    await self._cold_start(lease, placement, priority)
                    break
                except ModelBossError as exc:
                    if attempt == OOM_RETRIES or not OUT_OF_MEMORY.search(exc.message):
                        raise
                    self._claim_more(exc)
                    self.cancellable = True  # the next attempt makes room again
        except BaseException as exc:
            self.cancellable = False
            self.progress.report("failed", error=self.cancel_reason or str(exc)
                                 or type(exc).__name__)
            raise
        self.progress.report("ready")

    def _claim_more(self, exc: ModelBossError) -> None:
        """The worker ran out of GPU memory while loading: the lease was too small for it.
        The model's figure grows by a quarter (learned, so later loads claim it too) and the
        load goes again, making room for the larger claim."""
        model_id, before = self.owner.model_id, self.owner.slot.estimate
        old_mb = before.mb if before else 0
        new_mb = max(old_mb + 1, math.ceil(old_mb * OOM_GROWTH))
        self.owner.pool.learned.observe_vram(model_id, new_mb)
        self.owner.pool.events.emit("oom_retry", model=model_id, vram_mb=old_mb, to_mb=new_mb,
                                    reason=f"out of memory at {old_mb} MB; retried with "
                                           f"{new_mb} MB", error=exc.message[:300])

    async def _retire_parked(self, lease: Lease | None, placement: Placement | None) -> None:
        """The parked worker sees other GPUs than the lease's (its CUDA_VISIBLE_DEVICES is
        fixed at start): onloading it would put weights where this lease holds no VRAM. Stop
        it; the load goes on as a cold start on the leased GPUs."""
        s = self.owner.slot
        self.cancellable = False  # a stop cut short would leave the worker running
        try:
            s.transition(S.STOPPING, f"parked on GPUs {list(s.worker_gpus or ())}, leased "
                         f"{placement.gpus if placement else []}: cold start instead")
            await self.owner.stop_worker("parked worker sees other GPUs than its new lease")
        except BaseException as exc:
            await self._abandon_load(None, lease, exc)
            raise
        self.cancellable = True

    async def _cold_start(self, lease: Lease | None, placement: Placement | None,
                          priority: int) -> None:
        s = self.owner.slot
        s.lease, s.placement = lease, placement
        s.worker_gpus = tuple(placement.gpus) if placement else None
        s.transition(S.LOADING, f"load on GPUs {placement.gpus}" if placement else "load")
        started = time.monotonic()
        self.owner.pool.events.emit("load_started", model=self.owner.model_id,
                              gpus=placement.gpus if placement else [],
                              vram_mb=s.estimate.mb if s.estimate else 0,
                              rung=s.estimate.rung if s.estimate else "")
        backend: InferenceBackend | None = None
        try:
            backend = self.owner.pool.new_backend(s.entry)
            backend.on_exit = lambda code, b=backend: self.owner.worker_exited(b, code)
            # the worker tells its stages (and a fraction where it can) while it starts
            backend.on_progress = self.progress.report
            s.backend, s.port = backend, free_port()
            self.progress.report("starting")
            await backend.start(s.port, placement)
            s.port = backend.port or s.port  # a spare worker came with its own
            self._check_still_mine(lease, backend)
        except BaseException as exc:
            await self._abandon_load(backend, lease, exc)
            if isinstance(exc, ModelBossError) or not isinstance(exc, Exception):
                raise
            raise LoadFailed(f"loading '{self.owner.model_id}' failed: {exc}") from exc
        self.cancellable = False  # loaded: nothing is left to cancel
        s.last_load_s = round(time.monotonic() - started, 3)
        self.owner.pool.learned.observe_load(self.owner.model_id, s.last_load_s)
        s.loads += 1
        s.loaded_at = time.time()
        s.ready_in_s = s.last_load_s
        s.last_error = None
        s.transition(S.READY, f"loaded in {s.last_load_s}s")
        s.touch(priority)
        self.owner.pool.events.emit("loaded", model=self.owner.model_id, seconds=s.last_load_s,
                              pid=backend.pid, port=s.port)
        self.owner.pool.spawn(self.owner.pool.learn_footprint(s, backend))

    async def _onload(self, lease: Lease | None, placement: Placement | None,
                      priority: int) -> None:
        """OFFLOADED → READY in the same worker process."""
        s = self.owner.slot
        backend = s.backend
        assert backend is not None
        s.lease, s.placement = lease, placement
        s.transition(S.LOADING, "onload from CPU RAM")
        self.cancellable = False
        self.progress.report("loading", tier="cpu")
        started = time.monotonic()
        try:
            report = await backend.onload()
            self._check_still_mine(lease, backend)
        except BaseException as exc:
            self.owner.pool.events.emit("onload_failed", model=self.owner.model_id, error=str(exc))
            await self._abandon_load(backend, lease, exc)
            raise
        s.ram_reserved_mb = 0
        s.loaded_at = time.time()
        s.last_onload_s = round(time.monotonic() - started, 3)
        s.ready_in_s = s.last_onload_s
        s.transition(S.READY, f"onloaded in {s.last_onload_s}s")
        s.touch(priority)
        self.owner.pool.events.emit("onloaded", model=self.owner.model_id, seconds=s.last_onload_s,
                              worker_seconds=report.get("seconds"))

    def _check_still_mine(self, lease: Lease | None, backend: InferenceBackend) -> None:
        if lease is not None and self.owner.slot.lease is not lease:
            raise LoadFailed(f"'{self.owner.model_id}' lost its VRAM lease while loading",
                             retry_after_s=2)
        if not backend.alive:
            raise LoadFailed(f"worker for '{self.owner.model_id}' died right after loading",
                             retry_after_s=2)

    async def _abandon_load(self, backend: InferenceBackend | None, lease: Lease | None,
                            exc: BaseException) -> None:
        """A load failed (or was cancelled): stop its worker (if any), release its lease,
        back to IDLE."""
        self.cancellable = False  # from here on a cancel would leave a worker or a lease
        s = self.owner.slot
        cancelled = isinstance(exc, asyncio.CancelledError) and self.cancel_reason is not None
        reason = self.cancel_reason if cancelled else "load failed"
        s.last_error = reason if cancelled else (str(exc) or type(exc).__name__)
        if s.state == S.LOADING:
            s.transition(S.STOPPING, reason)
        s.backend, s.lease = backend, lease  # whatever the load had, stop_worker takes it all back
        await self.owner.stop_worker(reason, event="load_cancelled" if cancelled else "load_failed")


def _sees(worker_gpus: tuple[int, ...] | None, placement: Placement | None) -> bool:
    """Whether a worker started with ``worker_gpus`` visible can take ``placement``: the same
    GPUs in the same order (CUDA_VISIBLE_DEVICES renumbers them from 0)."""
    return placement is None or worker_gpus == tuple(placement.gpus)
