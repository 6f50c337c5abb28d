"""SlotLoad: one load of a slot, run as its owner's operation.

Room first (the pool carries out the planner's plan and hands back a lease), then either a cold
start of a new worker or an onload of the parked one; READY only if the lease is still the
slot's and the worker still alive. A failure stops whatever was started and releases the lease.

A model that may keep only some of its layers on the GPU (``allow_partial``) and finds less
VRAM than planned (its worker runs out of memory while it loads, or reports holding more than
its lease) is started again once, in the same lease, with the layers that fit
(placement.fewer_layers); a ``layers_lowered`` event, a log line and the placement's notes say
so, as they do when its planned lease was taken first and the planner placed fewer layers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from typing import TYPE_CHECKING

from ..backends.base import InferenceBackend
from ..backends.processes import free_port
from ..catalog import BackendKind
from ..errors import LoadFailed, ModelBossError
from ..gpu.estimate import placed
from ..gpu.lease import Lease
from ..gpu.placement import Placement, fewer_layers, fixed_layers, layers_on_gpu
from ..gpu.safetensors_info import model_layers
from ..scheduling.planner import Evict, Fit
from .progress import LoadProgress
from .reclaim import driver_free
from .slot import SlotState

if TYPE_CHECKING:
    from .host import SlotOperator

log = logging.getLogger(__name__)
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
        self.lowered = False  # its layers were lowered once (never twice in one load)

    async def run(self) -> None:
        s, priority = self.owner.slot, self.priority
        try:
            for attempt in range(1 + OOM_RETRIES):
                self.progress.report("leasing")
                entry = self.owner.pool.catalog.get_available(self.owner.model_id)
                s.entry = entry  # a reload's new manifest applies from this load on
                s.estimate = self.owner.pool.estimate(entry)
                planned = await self._planned(priority)
                lease, placement = await self.owner.pool.make_room(self.owner, priority)
                self._placed(placement, planned)
                if s.state == S.OFFLOADED:
                    placement = await self._parked_plan(lease, placement)
                if s.state == S.OFFLOADED:  # the worker may have died meanwhile: a cold load
                    await self._onload(lease, placement, priority)
                    break
                try:
                    await self._cold_start(lease, placement, priority)
                    break
                except ModelBossError as exc:
                    if attempt == OOM_RETRIES or not OUT_OF_MEMORY.search(exc.message) \
                            or self.lowered:
                        raise
                    self._claim_more(exc)
                    self.cancellable = True  # the next attempt makes room again
        except BaseException as exc:
            self.cancellable = False
            self.progress.report("failed", error=self.cancel_reason or str(exc)
                                 or type(exc).__name__)
            raise
        self.progress.report("ready")

    async def _planned(self, priority: int) -> Placement | None:
        """For a model that may keep fewer layers (``allow_partial``), not parked: where the
        planner would place it now, before room is made (make_room plans again when a lease
        it planned is taken first; this tells whether that cost it layers)."""
        s = self.owner.slot
        if s.state == S.OFFLOADED or self.owner.pool.layer_costs(s.entry) is None:
            return None
        plan = await self.owner.pool.plan(self.owner.key, priority)
        return plan.placement if isinstance(plan, Fit | Evict) else None

    def _placed(self, placement: Placement | None, planned: Placement | None) -> None:
        """The slot's estimate as placed: only the resident layers' when only some are on
        the GPU. Fewer layers than the manifest's own count, or than planned (the lease it
        planned was taken first), is said."""
        s = self.owner.slot
        if s.estimate is None or placement is None or placement.gpu_layers is None:
            return
        manifest = s.entry.manifest
        s.estimate = placed(s.estimate, placement, self._layout(),
                            manifest.offload_prefetch)
        wanted = fixed_layers(manifest.gpu_layers)
        if wanted is not None and placement.gpu_layers < wanted:
            self._say_lowered(wanted, placement, f"less free VRAM than {wanted} layers need")
        elif planned is not None and planned.gpu_layers is not None \
                and placement.gpu_layers < planned.gpu_layers:
            self._say_lowered(planned.gpu_layers, placement,
                              f"the lease planned for {planned.gpu_layers} layers was taken "
                              f"before it could be had")

    def _layout(self):
        """The model's repeated blocks, for a transformers model (its safetensors headers)."""
        entry = self.owner.slot.entry
        if entry.manifest.backend != BackendKind.TRANSFORMERS:
            return None
        return model_layers(entry.path)

    def _say_lowered(self, before: int, placement: Placement, why: str) -> None:
        log_line = (f"{before} layers on the GPU lowered to {placement.gpu_layers} of "
                    f"{placement.total_layers}: {why}")
        log.warning("%s: %s", self.owner.model_id, log_line)
        self.owner.pool.events.emit("layers_lowered", model=self.owner.model_id,
                                    from_layers=before, to_layers=placement.gpu_layers,
                                    total_layers=placement.total_layers, gpus=placement.gpus,
                                    reason=log_line)

    def _fewer_layers(self, placement: Placement | None, lease: Lease | None, why: str,
                      room: dict[int, int]) -> Placement | None:
        """Once per load, for a model that may keep fewer layers (``allow_partial``) and
        keeps some on one GPU: ``placement`` at the layers that fit ``room`` (the VRAM its
        GPU was found to have for it); None when that is not such a model, or when no count
        of at least ``min_gpu_layers`` fits."""
        s = self.owner.slot
        costs = self.owner.pool.layer_costs(s.entry)
        if self.lowered or costs is None or placement is None or lease is None:
            return None
        now = layers_on_gpu(placement, s.entry.manifest.gpu_layers)
        lowered = fewer_layers(placement, costs.total_layers if now < 0 else now, costs, room,
                               why)
        if lowered is None:
            return None
        self.lowered = True
        self._say_lowered(costs.total_layers if now < 0 else now, lowered, why)
        if s.estimate is not None:
            s.estimate = placed(s.estimate, lowered, self._layout(),
                                s.entry.manifest.offload_prefetch)
        return lowered

    async def _room_after_oom(self, lease: Lease) -> dict[int, int]:
        """What the lease's GPUs have for a worker that ran out of memory in it: a quarter
        less than the lease (the claim the model would grow by), and no more than the driver
        says is free there now, its worker gone (where NVML tells)."""
        boss = self.owner.pool.boss
        room = {gpu: int(mb / OOM_GROWTH) for gpu, mb in lease.allocations.items()}
        for gpu, free in (await driver_free(boss)).items():
            if gpu in room:
                room[gpu] = min(room[gpu], max(0, free - boss.margin_mb))
        return room

    def _claim_more(self, exc: ModelBossError) -> None:
        """The worker ran out of GPU memory while loading: the lease was too small for it.
        The model's figure grows by a quarter (learned, so later loads claim it too) and the
        load goes again, making room for the larger claim. (A manifest's count of GPU layers:
        the figure at that count, the one its estimate reads.)"""
        model_id, before = self.owner.model_id, self.owner.slot.estimate
        old_mb = before.mb if before else 0
        new_mb = max(old_mb + 1, math.ceil(old_mb * OOM_GROWTH))
        self.owner.pool.learned.observe_vram(
            model_id, new_mb, fixed_layers(self.owner.slot.entry.manifest.gpu_layers))
        self.owner.pool.events.emit("oom_retry", model=model_id, vram_mb=old_mb, to_mb=new_mb,
                                    reason=f"out of memory at {old_mb} MB; retried with "
                                           f"{new_mb} MB", error=exc.message[:300])

    async def _parked_plan(self, lease: Lease | None,
                           placement: Placement | None) -> Placement | None:
        """A parked worker comes back as it was parked: on the GPUs it sees (its
        CUDA_VISIBLE_DEVICES is fixed at start) with the layers it kept on them (its offload
        plan: the streamed blocks never left CPU RAM), which the placement then says. When
        the new lease is on other GPUs, or too small for those layers, the parked worker is
        stopped and the load goes on as a cold start on ``placement``."""
        s = self.owner.slot
        if not _sees(s.worker_gpus, placement):
            await self._retire_parked(lease, f"parked on GPUs {list(s.worker_gpus or ())}, "
                                             f"leased {placement.gpus if placement else []}")
            return placement
        kept = await self._parked_layers()
        if kept is None or placement is None or s.estimate is None:
            return placement
        layers, total = kept
        plan = Placement(dict(placement.allocations), "partial", gpu_layers=layers,
                         total_layers=total,
                         notes=[f"{layers}/{total} layers on GPU "
                                f"{','.join(map(str, placement.gpus))}: the plan it was "
                                f"parked with"])
        need = placed(s.estimate, plan, self._layout(), s.entry.manifest.offload_prefetch)
        if len(placement.allocations) == 1 and sum(placement.allocations.values()) >= need.mb:
            s.estimate = need
            return plan
        await self._retire_parked(lease, f"parked with {layers} of {total} layers on the "
                                         f"GPU, which need {need.mb} MB; leased "
                                         f"{sum(placement.allocations.values())} MB")
        return placement

    async def _parked_layers(self) -> tuple[int, int] | None:
        """The layers the parked worker keeps on its GPU, of its model's (its report), when
        it streams the others; None when it holds its model whole."""
        backend = self.owner.slot.backend
        try:
            report = await backend.report() if backend is not None else {}
        except Exception:  # a worker that cannot say: its onload will tell
            return None
        layers, total = report.get("gpu_layers"), report.get("total_layers")
        if isinstance(layers, int) and isinstance(total, int) and 0 <= layers < total:
            return layers, total
        return None

    async def _retire_parked(self, lease: Lease | None, why: str) -> None:
        """The parked worker cannot take the new lease (it sees other GPUs, or keeps more
        layers than the lease holds): onloading it would put weights where this lease holds
        no VRAM. Stop it; the load goes on as a cold start on the leased GPUs."""
        s = self.owner.slot
        self.cancellable = False  # a stop cut short would leave the worker running
        try:
            s.transition(S.STOPPING, f"{why}: cold start instead")
            await self.owner.stop_worker(f"parked worker cannot take its new lease: {why}")
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
        try:
            try:
                backend = await self._start(lease, placement)
            except Exception as exc:
                said = exc.message if isinstance(exc, ModelBossError) else str(exc)
                lowered = self._fewer_layers(
                    placement, lease, f"out of memory while loading: {said[:200]}",
                    await self._room_after_oom(lease)) \
                    if lease is not None and OUT_OF_MEMORY.search(said) else None
                if lowered is None:
                    raise
                backend = await self._restart(lease, lowered)  # once, in the same lease
            else:
                lowered = await self._short_of_vram(backend, lease, placement)
                if lowered is not None:
                    backend = await self._restart(lease, lowered)
        except BaseException as exc:
            await self._abandon_load(s.backend, lease, exc)
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

    async def _start(self, lease: Lease | None,
                     placement: Placement | None) -> InferenceBackend:
        """A new worker for the slot, started on ``placement`` (the slot's from now on)."""
        s = self.owner.slot
        s.placement = placement
        backend = self.owner.pool.new_backend(s.entry)
        backend.on_exit = lambda code, b=backend: self.owner.worker_exited(b, code)
        # the worker tells its stages (and a fraction where it can) while it starts
        backend.on_progress = self.progress.report
        s.backend, s.port = backend, free_port()
        self.progress.report("starting")
        await backend.start(s.port, placement)
        s.port = backend.port or s.port  # a spare worker came with its own
        self._check_still_mine(lease, backend)
        return backend

    async def _restart(self, lease: Lease | None, placement: Placement) -> InferenceBackend:
        """The worker started so far stopped, and a new one started on ``placement``."""
        s = self.owner.slot
        old, s.backend = s.backend, None
        if old is not None:
            with contextlib.suppress(Exception):
                await old.stop()
        return await self._start(lease, placement)

    async def _short_of_vram(self, backend: InferenceBackend, lease: Lease | None,
                             placement: Placement | None) -> Placement | None:
        """A worker that keeps some layers on a GPU and reports holding more VRAM there than
        its lease (the CUDA allocator's figure): the placement at the layers that fit, the
        costs grown by what it holds over what was leased; None when it holds no more (or
        reports no CUDA figure, as on the CPU). The transformers worker's report says it; a
        llama.cpp server's does not (its measure is NVML's, once it is READY)."""
        if lease is None or placement is None or self._layout() is None \
                or self.owner.pool.layer_costs(self.owner.slot.entry) is None:
            return None
        report = await backend.report()
        memory = report.get("memory") or {}
        held = memory.get("cuda_reserved_mb") or memory.get("cuda_allocated_mb")
        leased = sum(lease.allocations.values())
        if not held or held <= leased:
            return None
        # every cost grown by what it holds over its lease: the lease holds leased²/held of
        # what was planned
        return self._fewer_layers(
            placement, lease, f"the worker holds {int(held)} MB of VRAM, its lease "
                              f"{leased} MB",
            {gpu: int(mb * leased / held) for gpu, mb in lease.allocations.items()})

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
