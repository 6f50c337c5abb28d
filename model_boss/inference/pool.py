"""ModelPool: slots by model id, loading with placement and eviction, the keep-alive reaper."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ..catalog import BackendKind, Catalog, CatalogEntry
from ..errors import CapacityExceeded, LeaseUnavailable, LoadFailed, ModelBossError
from ..events import EventBus
from ..gpu.boss import GPUBoss
from ..gpu.estimate import VramEstimate, estimate_vram
from ..gpu.gguf_info import layer_costs_mb, read_gguf_info
from ..gpu.placement import LayerCosts, Placement, place
from ..settings import Settings
from .backend import InferenceBackend
from .cpu_tier import CpuTier
from .eviction import SlotView, evict_candidates, victims_for
from .learned import LearnedStats
from .process import free_port
from .slot import ModelSlot, SlotState

log = logging.getLogger(__name__)

BackendFactory = Callable[[CatalogEntry, Settings], InferenceBackend]


def default_backend_factory(entry: CatalogEntry, settings: Settings) -> InferenceBackend:
    from .backends import BACKENDS

    kind = entry.manifest.backend
    if kind not in BACKENDS:
        raise LoadFailed(f"backend '{kind}' is not available in this installation")
    return BACKENDS[kind](entry, settings)


@dataclass(frozen=True, slots=True)
class Admission:
    """Whether a load for a model can start now. ``never`` → fail the request at once."""

    can_start: bool
    never: bool = False
    reason: str = ""
    blocking: tuple[str, ...] = ()  # busy slots that would be evicted once idle


class ModelPool(CpuTier):
    """Owns every :class:`ModelSlot`; the only place workers are started or stopped."""

    def __init__(self, catalog: Catalog, boss: GPUBoss, settings: Settings, events: EventBus,
                 backend_factory: BackendFactory = default_backend_factory) -> None:
        self.catalog = catalog
        self.boss = boss
        self.settings = settings
        self.events = events
        self.backend_factory = backend_factory
        self.slots: dict[str, ModelSlot] = {}
        self.learned = LearnedStats(settings.state_path / "learned.json")
        self._lock = asyncio.Lock()
        self._loading: dict[str, asyncio.Task] = {}
        self._tasks: set[asyncio.Task] = set()
        self.on_change: Callable[[], None] = lambda: None

    # -- slots ----------------------------------------------------------------------------

    def slot(self, model_id: str) -> ModelSlot:
        slot = self.slots.get(model_id)
        if slot is None:
            entry = self.catalog.get(model_id)
            manifest = entry.manifest
            slot = ModelSlot(entry=entry, events=self.events, pinned=manifest.pin)
            slot.stay_warm_s = self.stay_warm_for(entry)
            self.slots[model_id] = slot
        return slot

    def stay_warm_for(self, entry: CatalogEntry) -> float:
        manifest = entry.manifest
        if manifest.stay_warm_s is not None:
            return manifest.stay_warm_s
        return self.settings.stay_warm_for(str(manifest.category))

    def estimate(self, entry: CatalogEntry) -> VramEstimate:
        return estimate_vram(entry.manifest, entry.path,
                             measured_mb=self.learned.get(entry.manifest.id).vram_mb)

    def needs_vram(self, entry: CatalogEntry) -> bool:
        return entry.manifest.backend not in (BackendKind.CLOUD,)

    def allow_split(self, entry: CatalogEntry) -> bool:
        return entry.manifest.backend in (BackendKind.LLAMA_SERVER, BackendKind.DIFFUSERS)

    def layer_costs(self, entry: CatalogEntry) -> LayerCosts | None:
        """Per-layer costs for partial GPU offload (llama models with ``allow_partial``)."""
        manifest = entry.manifest
        if not manifest.allow_partial or manifest.backend != BackendKind.LLAMA_SERVER \
                or entry.path is None:
            return None
        info = read_gguf_info(entry.path)
        if info is None or info.block_count < 2:
            return None
        per_layer, fixed = layer_costs_mb(info, manifest.ctx_size)
        return LayerCosts(per_layer, fixed, info.block_count, manifest.min_gpu_layers)

    def placement_for(self, entry: CatalogEntry, need_mb: int,
                      free: dict[int, int]) -> Placement | None:
        return place(need_mb, free, allow_split=self.allow_split(entry),
                     partial=self.layer_costs(entry))

    def views(self, exclude: str | None = None) -> list[SlotView]:
        return [
            SlotView(s.model_id, str(s.state), s.pinned, s.active, s.last_used,
                     s.last_priority, s.unload_at, dict(s.lease.allocations) if s.lease else {})
            for s in self.slots.values() if s.model_id != exclude
        ]

    def is_loading(self, model_id: str) -> bool:
        task = self._loading.get(model_id)
        return task is not None and not task.done()

    # -- decisions ------------------------------------------------------------------------

    async def admission(self, model_id: str, priority: int) -> Admission:
        """Can a load of ``model_id`` for a request of ``priority`` start right now?"""
        entry = self.catalog.get_available(model_id)
        if not self.needs_vram(entry):
            return Admission(True)
        need = self.estimate(entry).mb
        usage = await self.boss.usage()
        free = {u.index: u.free_mb for u in usage}
        split = self.allow_split(entry)
        if self.placement_for(entry, need, free):
            return Admission(True)
        now = time.time()
        views = self.views(exclude=model_id)
        if victims_for(need, free, evict_candidates(views, priority, now),
                       allow_split=split) is not None:
            return Admission(True)
        # Could it ever fit? Pinned slots never leave; everything else eventually may.
        pinned: dict[int, int] = {}
        for view in views:
            if view.pinned:
                for gpu, mb in view.allocations.items():
                    pinned[gpu] = pinned.get(gpu, 0) + mb
        ceiling = {u.index: max(0, u.capacity_mb - self.boss.margin_mb - pinned.get(u.index, 0))
                   for u in usage}
        if not self.placement_for(entry, need, ceiling):
            where = ", ".join(f"GPU {i}: {mb} MB" for i, mb in ceiling.items())
            return Admission(False, never=True, reason=(
                f"'{model_id}' needs {need} MB of VRAM; at most {where} can ever be free "
                f"for it (capacity minus margin minus pinned models)"))
        # It would fit once busy or more important slots go idle / expire.
        busy = tuple(v.model_id for v in views if v.allocations and not v.pinned)
        return Admission(False, reason=f"'{model_id}' needs {need} MB; waiting for room",
                         blocking=busy)

    # -- loading --------------------------------------------------------------------------

    def start_load(self, model_id: str, priority: int) -> asyncio.Task:
        """Start loading ``model_id`` in the background (one load per model at a time)."""
        task = self._loading.get(model_id)
        if task is None or task.done():
            task = asyncio.create_task(self.load(model_id, priority), name=f"load-{model_id}")
            self._loading[model_id] = task
            task.add_done_callback(lambda _t: self.on_change())
        return task

    async def get_or_load(self, model_id: str, priority: int) -> ModelSlot:
        """The READY slot for ``model_id``, loading (or onloading) it first if needed."""
        return await self.load(model_id, priority)

    async def load(self, model_id: str, priority: int) -> ModelSlot:
        """Make ``model_id`` READY: place it, evict one idle slot at a time until it fits.

        An OFFLOADED slot (weights parked in CPU RAM) is onloaded into the same worker
        process instead of a cold start."""
        slot = self.slot(model_id)
        entry = self.catalog.get_available(model_id)
        if slot.state == SlotState.READY:
            return slot
        estimate = self.estimate(entry)
        slot.estimate = estimate
        placement: Placement | None = None
        while True:
            async with self._lock:
                if slot.state == SlotState.READY:
                    return slot
                if slot.state not in (SlotState.IDLE, SlotState.OFFLOADED):
                    raise LoadFailed(f"'{model_id}' is {slot.state}; cannot load now",
                                     retry_after_s=2)
                if not self.needs_vram(entry):
                    slot.transition(SlotState.LOADING, "load (no VRAM needed)")
                    break
                free = await self.boss.free_mb()
                placement = self.placement_for(entry, estimate.mb, free)
                if placement is not None:
                    try:
                        slot.lease = await self.boss.acquire(
                            kind="inference", allocations=placement.allocations,
                            priority=priority, note=model_id)
                    except LeaseUnavailable:
                        placement = None  # someone outside took it between read and acquire
                    else:
                        slot.placement = placement
                        if slot.state == SlotState.OFFLOADED:
                            return await self._onload(slot, priority)
                        slot.transition(SlotState.LOADING, f"load on GPUs {placement.gpus}")
                        break
                victims = victims_for(
                    estimate.mb, free,
                    evict_candidates(self.views(exclude=model_id), priority, time.time()),
                    allow_split=self.allow_split(entry))
                if not victims:
                    raise CapacityExceeded(
                        f"no room for '{model_id}' ({estimate.mb} MB, {estimate.rung}) and "
                        f"nothing can be evicted for it now", retry_after_s=5)
                victim = self.slots[victims[0].model_id]
                await self._evict(victim, f"room for {model_id}")
            await asyncio.sleep(self.settings.reclaim_sleep_s)  # the driver reclaims, unlocked
        return await self._start_worker(slot, entry, placement, priority)

    async def _start_worker(self, slot: ModelSlot, entry: CatalogEntry,
                            placement: Placement | None, priority: int) -> ModelSlot:
        started = time.monotonic()
        self.events.emit("load_started", model=slot.model_id,
                         gpus=placement.gpus if placement else [],
                         vram_mb=slot.estimate.mb if slot.estimate else 0,
                         rung=slot.estimate.rung if slot.estimate else "")
        backend: InferenceBackend | None = None
        try:
            backend = self.backend_factory(entry, self.settings)
            backend.on_exit = lambda code, b=backend: self._worker_exited(slot, b, code)
            slot.backend = backend
            slot.port = free_port()
            await backend.start(slot.port, placement)
        except BaseException as exc:
            await self._release_lease(slot)
            slot.backend = None
            slot.port = None
            slot.last_error = str(exc) or type(exc).__name__
            if slot.state == SlotState.LOADING:
                slot.transition(SlotState.IDLE, "load failed")
            self.events.emit("load_failed", model=slot.model_id, error=slot.last_error)
            if isinstance(exc, ModelBossError) or not isinstance(exc, Exception):
                raise
            raise LoadFailed(f"loading '{slot.model_id}' failed: {exc}") from exc
        slot.last_load_s = round(time.monotonic() - started, 3)
        self.learned.observe_load(slot.model_id, slot.last_load_s)
        slot.loads += 1
        slot.loaded_at = time.time()
        slot.last_error = None
        slot.transition(SlotState.READY, f"loaded in {slot.last_load_s}s")
        slot.touch(priority)
        await self._learn_footprint(slot, backend)
        self.events.emit("loaded", model=slot.model_id, seconds=slot.last_load_s,
                         pid=backend.pid, port=slot.port)
        return slot

    async def _learn_footprint(self, slot: ModelSlot, backend: InferenceBackend) -> None:
        """Record what the worker measured. Real VRAM (CUDA figures from the worker, or NVML
        per-process usage) becomes the model's learned estimate; a CPU-only footprint is shown
        but does not replace the declared figure, since a declared GPU has no VRAM to measure."""
        try:
            report = await backend.report()
        except Exception as exc:
            log.debug("no report from %s: %s", slot.model_id, exc)
            report = {}
        memory = report.get("memory") or {}
        vram = memory.get("cuda_reserved_mb") or memory.get("cuda_allocated_mb")
        if not vram and self.boss.nvml is not None and backend.pid and slot.lease:
            used = [self.boss.nvml.process_used_mb(gpu, {backend.pid})
                    for gpu in slot.lease.gpus]
            vram = sum(u for u in used if u) or None
        footprint = vram or report.get("footprint_mb")
        if footprint:
            slot.measured_mb = int(footprint)
        if vram:
            self.learned.observe_vram(slot.model_id, int(vram))
        if footprint:
            self.events.emit("measured", model=slot.model_id, mb=int(footprint),
                             vram=bool(vram), loads_from_disk=report.get("loads_from_disk"))

    def _worker_exited(self, slot: ModelSlot, backend: InferenceBackend, code: int) -> None:
        """A worker died on its own: back to IDLE, lease released, next request reloads."""
        if slot.backend is not backend or slot.state not in (SlotState.READY,
                                                             SlotState.OFFLOADED):
            return  # a load in progress reports the death itself
        slot.last_error = f"worker exited unexpectedly with {code}"
        slot.backend = None
        slot.port = None
        slot.transition(SlotState.IDLE, slot.last_error)
        self.events.emit("worker_crashed", model=slot.model_id, code=code, pid=backend.pid)
        self._spawn(self._after_crash(slot, backend))

    async def _after_crash(self, slot: ModelSlot, backend: InferenceBackend) -> None:
        await self._release_lease(slot)
        with contextlib.suppress(Exception):
            await backend.stop()
        self.on_change()

    # -- unloading ------------------------------------------------------------------------

    async def _release_lease(self, slot: ModelSlot) -> None:
        lease, slot.lease, slot.placement = slot.lease, None, None
        if lease is not None:
            try:
                await self.boss.release(lease.id)
            except Exception as exc:  # the lease will expire without its heartbeat anyway
                log.warning("releasing lease %s of %s failed: %s", lease.id, slot.model_id, exc)

    async def _evict(self, slot: ModelSlot, reason: str) -> None:
        """Free the slot's VRAM: park it in CPU RAM when its backend can and RAM allows,
        else stop it (disk tier)."""
        tier = "cpu" if await self._offload(slot, f"evicted: {reason}") else "disk"
        self.events.emit("evicted", model=slot.model_id, reason=reason, tier=tier,
                         last_priority=slot.last_priority)
        if tier == "disk":
            await self._stop(slot, f"evicted: {reason}")

    async def _stop(self, slot: ModelSlot, reason: str) -> None:
        """Stop a READY/OFFLOADED slot. The state check and STOPPING happen with no await
        between them, so no request can be granted the slot after we decided to stop it."""
        if slot.state not in (SlotState.READY, SlotState.OFFLOADED) or slot.active:
            return
        slot.transition(SlotState.STOPPING, reason)
        backend, slot.backend = slot.backend, None
        try:
            if backend is not None:
                await backend.stop()
        finally:
            await self._release_lease(slot)
            slot.port = None
            slot.ram_reserved_mb = 0
            slot.transition(SlotState.IDLE, "stopped")
            self.events.emit("unloaded", model=slot.model_id, reason=reason)
            self.on_change()

    async def unload(self, model_id: str, reason: str = "unload requested") -> bool:
        slot = self.slots.get(model_id)
        if slot is None or slot.state not in (SlotState.READY, SlotState.OFFLOADED):
            return False
        if slot.active:
            raise CapacityExceeded(f"'{model_id}' is serving {slot.active} request(s)",
                                   retry_after_s=2, status_code=409, code="model_busy")
        async with self._lock:
            await self._stop(slot, reason)
        return True

    def request_finished(self, slot: ModelSlot) -> None:
        """Called when a request on ``slot`` ends; honours keep-alive 0."""
        if slot.active == 0 and slot.unload_after_request and not slot.pinned:
            slot.unload_after_request = False
            self._spawn(self.unload(slot.model_id, "keep_alive 0"))
        self.on_change()

    async def reap_expired(self) -> list[str]:
        now = time.time()
        stopped = []
        for slot in list(self.slots.values()):
            if slot.evictable_state and slot.expired(now):
                async with self._lock:
                    if slot.expired(time.time()):
                        await self._stop(slot, "stay-warm expired")
                        stopped.append(slot.model_id)
        return stopped

    async def reaper(self) -> None:
        """Background loop: unload slots past ``unload_at``. Never dies."""
        while True:
            await asyncio.sleep(self.settings.reaper_interval_s)
            try:
                await self.reap_expired()
            except Exception:
                log.exception("reaper pass failed; carrying on")

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_failure)
        return task

    async def shutdown(self) -> None:
        """Stop every worker and release every lease."""
        for task in list(self._loading.values()) + list(self._tasks):
            task.cancel()
        for task in list(self._loading.values()) + list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        for slot in list(self.slots.values()):
            if slot.state in (SlotState.READY, SlotState.OFFLOADED, SlotState.LOADING):
                slot.transition(SlotState.STOPPING, "shutdown")
            backend, slot.backend = slot.backend, None
            if backend is not None:
                with contextlib.suppress(Exception):
                    await backend.stop()
            await self._release_lease(slot)
            if slot.state == SlotState.STOPPING:
                slot.transition(SlotState.IDLE, "shutdown")

    def status(self) -> list[dict]:
        result = []
        for slot in self.slots.values():
            data = slot.to_dict()
            if slot.estimate is None:
                with contextlib.suppress(Exception):
                    data["vram_estimate"] = self.estimate(slot.entry).to_dict()
            data["learned"] = asdict(self.learned.get(slot.model_id))
            result.append(data)
        return result


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("background task %s failed: %s", task.get_name(), task.exception())
