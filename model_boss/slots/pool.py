"""ModelPool: an owner per copy of a model (by slot key), room-making, the keep-alive reaper."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ..backends.base import InferenceBackend
from ..backends.llama.prompt_cache import PromptCache
from ..backends.processes import WorkerTemplates
from ..backends.spare import SpareWorkers
from ..catalog import BackendKind, Catalog, CatalogEntry
from ..errors import CapacityExceeded, LeaseUnavailable, LoadFailed
from ..events import EventBus
from ..gpu.boss import GPUBoss
from ..gpu.estimate import VramEstimate, estimate_vram, with_companions
from ..gpu.gguf_info import layer_costs_mb, read_gguf_info
from ..gpu.lease import Lease
from ..gpu.placement import LayerCosts, Placement, fixed_layers, partial_layers
from ..gpu.safetensors_info import layer_costs_mb as safetensors_layer_costs
from ..gpu.safetensors_info import model_layers
from ..scheduling import planner
from ..scheduling.eviction import SlotView
from ..scheduling.learned import LearnedStats
from ..scheduling.planner import Demand, Evict, Fit, Plan, Snapshot, Wait
from ..scheduling.rates import RequestRates
from ..settings import Settings
from ..slot_key import SlotKey, slot_key
from .cpu_tier import CpuTier
from .owner import SlotOwner
from .reclaim import driver_free, held_vram, wait_reclaimed
from .replicas import Replicas
from .slot import ModelSlot, SlotState
from .status import pool_status

log = logging.getLogger(__name__)

ONLOAD_GUESS_S = 1.0  # a CPU-tier onload before one was measured
MAX_PLAN_ROUNDS = 50  # re-plans one load may take while others race it for the same VRAM
BackendFactory = Callable[[CatalogEntry, Settings], InferenceBackend]


def default_backend_factory(entry: CatalogEntry, settings: Settings) -> InferenceBackend:
    from ..backends.registry import BACKENDS

    kind = entry.manifest.backend
    if kind not in BACKENDS:
        raise LoadFailed(f"backend '{kind}' is not available in this installation")
    return BACKENDS[kind](entry, settings)


class ModelPool(Replicas):
    """Slots by slot key (a model's first copy is keyed by its id), each driven by its
    :class:`SlotOwner`; makes room for loads by asking the pure planner and carrying out its
    plan. Holds no lock across I/O: the lease store is the arbiter of VRAM, and each owner
    serialises its own slot's operations."""

    def __init__(self, catalog: Catalog, boss: GPUBoss, settings: Settings, events: EventBus,
                 backend_factory: BackendFactory = default_backend_factory) -> None:
        self.catalog = catalog
        self.boss = boss
        self.settings = settings
        self.events = events
        self.backend_factory = backend_factory
        self.slots: dict[SlotKey, ModelSlot] = {}
        self.kept_warm: dict[str, float] = {}  # a preload entry's own keep-alive, by model
        self.owners: dict[SlotKey, SlotOwner] = {}
        self.cpu_tier = CpuTier(settings, self.owners)
        self.learned = LearnedStats(settings.state_path / "learned.json")
        self.templates = WorkerTemplates(settings)
        self.spares = SpareWorkers(settings, events, self.templates)
        self.prompt_cache = PromptCache(settings.prompt_cache_path, settings.prompt_cache_mb,
                                        settings.prompt_cache_min_tokens,
                                        settings.prompt_cache_save_s)
        self._tasks: set[asyncio.Task] = set()
        self._claims: dict[SlotKey, dict[int, int]] = {}  # evicted for by a load, not leased
        self.on_change: Callable[[], None] = lambda: None
        self.wanted: Callable[[], tuple[str, ...]] = tuple  # the waiters' models, in order
        self.rates = RequestRates(settings.request_rate_horizon_s)

    # -- slots ----------------------------------------------------------------------------

    def owner(self, model_id: str) -> SlotOwner:
        """The owner of ``model_id``'s first copy (made on first use)."""
        model_id = self.catalog.base_of(model_id)  # an adapter is served on its base's slot
        owner = self.owners.get(slot_key(model_id))
        if owner is None:
            entry = self.catalog.get(model_id)
            slot = ModelSlot(entry=entry, events=self.events, pinned=entry.manifest.pin)
            slot.stay_warm_s = self.stay_warm_for(entry)
            owner = SlotOwner(slot, self)
            self.slots[slot.key] = slot
            self.owners[slot.key] = owner
        return owner

    def slot(self, model_id: str) -> ModelSlot:
        return self.owner(model_id).slot

    def new_backend(self, entry: CatalogEntry) -> InferenceBackend:
        """A backend for one load of ``entry``, given the spares, templates and cache it takes."""
        backend = self.backend_factory(entry, self.settings)
        for shared in ("spares", "templates", "prompt_cache"):
            if hasattr(backend, shared):
                setattr(backend, shared, getattr(self, shared))
        return backend

    def stay_warm_for(self, entry: CatalogEntry) -> float:
        manifest = entry.manifest
        if manifest.id in self.kept_warm:
            return self.kept_warm[manifest.id]
        if manifest.stay_warm_s is not None:
            return manifest.stay_warm_s
        return self.settings.stay_warm_for(str(manifest.category))

    def estimate(self, entry: CatalogEntry) -> VramEstimate:
        manifest = entry.manifest  # measured at the manifest's own count of GPU layers
        found = estimate_vram(manifest, entry.path, measured_mb=self.learned.measured_vram(
            manifest.id, fixed_layers(manifest.gpu_layers)))
        return with_companions(found, entry.companions(self.settings.models_path))

    def footprint_mb(self, slot: ModelSlot) -> int:
        if slot.measured_mb:
            return slot.measured_mb
        return slot.estimate.mb if slot.estimate else self.estimate(slot.entry).mb

    def layer_costs(self, entry: CatalogEntry) -> LayerCosts | None:
        """Per-layer costs for partial GPU offload (models with ``allow_partial``: llama's
        from the GGUF, a transformers model's from its safetensors headers)."""
        manifest = entry.manifest
        if not manifest.allow_partial or entry.path is None:
            return None
        if manifest.backend == BackendKind.TRANSFORMERS:
            layout = model_layers(entry.path)
            if layout is None:
                return None
            per_layer, fixed = safetensors_layer_costs(layout, manifest.offload_prefetch)
            return LayerCosts(per_layer, fixed, layout.count, manifest.min_gpu_layers,
                              fixed_layers(manifest.gpu_layers))
        if manifest.backend != BackendKind.LLAMA_SERVER:
            return None
        info = read_gguf_info(entry.path)
        if info is None or info.block_count < 2:
            return None
        per_layer, fixed = layer_costs_mb(info, manifest.ctx_size)
        return LayerCosts(per_layer, fixed, info.block_count, manifest.min_gpu_layers)

    def is_loading(self, key: SlotKey) -> bool:
        owner = self.owners.get(key)
        return owner is not None and owner.loading

    # -- decisions ------------------------------------------------------------------------

    def demand(self, entry: CatalogEntry, priority: int) -> Demand:
        """What loading ``entry``'s first copy needs (:meth:`replica_demand`: any copy's)."""
        manifest = entry.manifest
        return Demand(slot_key(manifest.id), self.estimate(entry).mb, priority,
                      allow_split=manifest.backend in (BackendKind.LLAMA_SERVER,
                                                       BackendKind.DIFFUSERS),
                      layers=self.layer_costs(entry),
                      needs_vram=manifest.backend != BackendKind.CLOUD)

    async def snapshot(self, for_key: SlotKey | None = None) -> Snapshot:
        """One read of the lease store plus the slots as they are now. VRAM other loads have
        evicted for (their claims) is not free for the copy ``for_key``."""
        usage = await self.boss.usage()
        free = {u.index: u.free_mb for u in usage}
        for key, claim in self._claims.items():
            if key != for_key:
                for gpu, mb in claim.items():
                    free[gpu] = max(0, free.get(gpu, 0) - mb)
        now = time.time()
        views = tuple(
            SlotView(s.key, str(s.state), s.pinned, s.active, s.last_used,
                     s.last_priority, s.unload_at, dict(s.lease.allocations) if s.lease else {},
                     reload_s=self.reload_s(s), rate_per_s=self.rates.rate(s.model_id, now),
                     held_priority=s.held_priority)
            for s in self.slots.values())
        return Snapshot(free,
                        {u.index: max(0, u.capacity_mb - self.boss.margin_mb) for u in usage},
                        views, now, self.wanted())

    def reload_s(self, slot: ModelSlot) -> float:
        """What evicting ``slot`` costs when it is next wanted: a CPU-tier onload when it
        would be parked in RAM, else its learned cold load."""
        if slot.state == SlotState.READY and slot.backend is not None \
                and slot.backend.can_offload:
            return slot.last_onload_s or ONLOAD_GUESS_S
        return self.learned.predicted_load_s(slot.model_id, self.footprint_mb(slot))

    async def plan(self, key: SlotKey, priority: int) -> Plan:
        """The planner's answer for loading the copy ``key`` (a model's first copy is keyed
        by its id) for a request of ``priority`` now."""
        # a copy past the first has its slot before it is planned: one not made yet is a
        # model's first, whose key is the model's id
        owner = self.owners.get(key) or self.owner(key)
        self.catalog.get_available(owner.model_id)
        return planner.plan(self.replica_demand(owner, priority),
                            await self.snapshot(owner.key))

    async def make_room(self, owner: SlotOwner, priority: int,
                        ) -> tuple[Lease | None, Placement | None]:
        """Carry out plans until the load holds a lease: evict one victim at a time (its
        owner does it, only if it is idle), wait for the driver to reclaim, re-plan."""
        try:
            for _ in range(MAX_PLAN_ROUNDS):
                snapshot = await self.snapshot(owner.key)
                # the demand after the read, and the claim below before the next wait: a
                # sibling copy planned at the same time sees this one's GPUs and avoids them
                demand = self.replica_demand(owner, priority)
                decision = planner.plan(demand, snapshot)
                if isinstance(decision, Fit):
                    if decision.placement is None:
                        return None, None
                    self._claims[owner.key] = dict(decision.placement.allocations)
                    try:
                        lease = await self._acquire(decision.placement, priority,
                                                    owner.key)
                    except LeaseUnavailable:  # taken between the read and the acquire
                        self._claims.pop(owner.key, None)
                        await asyncio.sleep(0.05)
                        continue
                    return lease, decision.placement
                if isinstance(decision, Evict):
                    # claim the room first, so no other load takes what this one frees
                    self._claims[owner.key] = dict(decision.placement.allocations)
                    victim = self.owners[decision.victims[0]]
                    held = held_vram(victim.slot)
                    before = await driver_free(self.boss) if held else {}
                    tier = await victim.evict(f"room for {owner.model_id}")
                    if tier:
                        await wait_reclaimed(self.boss, self.settings.reclaim_sleep_s, tier,
                                             held, before)
                    else:
                        await asyncio.sleep(0.05)  # it just became busy: re-plan
                    continue
                retry = decision.retry_after_s if isinstance(decision, Wait) else 30
                raise CapacityExceeded(f"no room for '{owner.key}' ({demand.need_mb} MB)"
                                       f": {decision.reason}", retry_after_s=retry)
            raise CapacityExceeded(f"no room for '{owner.model_id}' after {MAX_PLAN_ROUNDS} "
                                   f"plans; others keep taking the VRAM", retry_after_s=5)
        finally:
            self._claims.pop(owner.key, None)

    async def _acquire(self, placement: Placement, priority: int, key: SlotKey) -> Lease:
        """Take the lease (its note: the copy's key); a load cancelled while the store
        answers gives the lease back once it arrives, so a cancelled load never leaves one
        behind."""
        taking = asyncio.ensure_future(self.boss.acquire(
            kind="inference", allocations=placement.allocations, priority=priority,
            note=key))
        try:
            return await asyncio.shield(taking)
        except asyncio.CancelledError:
            taking.add_done_callback(lambda t: self._give_back(t, key))
            raise

    def _give_back(self, taking: asyncio.Future, key: SlotKey) -> None:
        if not taking.cancelled() and taking.exception() is None:
            self.spawn(self.release_lease(taking.result(), key))

    # -- asking the owners ----------------------------------------------------------------

    async def ensure_ready(self, model_id: str, priority: int) -> ModelSlot:
        """The READY slot for ``model_id``; joins a load already in flight."""
        return await self.owner(model_id).ensure_ready(priority)

    def start_load(self, model_id: str, priority: int) -> asyncio.Task | None:
        """Begin loading ``model_id`` now (synchronously) unless an operation is in flight;
        the load task to watch, or None."""
        return self.owner(model_id).start_load(priority)

    async def unload(self, model_id: str, reason: str = "unload requested",
                     wait_s: float = 0.0,
                     only_if: Callable[[ModelSlot], bool] | None = None) -> bool:
        """Unload every copy of ``model_id`` (those ``only_if`` lets go, when given),
        together: each waits up to ``wait_s`` for its running requests. False: none had a
        worker. A copy still busy raises (409 ``model_busy``) once the others are done: they
        are unloaded, it goes on serving."""
        owners = self.replicas(model_id)
        done = await asyncio.gather(
            *(o.unload(reason, wait_s=wait_s, wait_for_op=True, only_if=only_if)
              for o in owners), return_exceptions=True)
        self.prune_replicas()
        for result in done:
            if isinstance(result, BaseException):
                raise result
        return any(done)

    async def offload(self, model_id: str, wait_s: float = 0.0) -> bool:
        return await self.owner(model_id).offload(wait_s=wait_s)

    def set_pinned(self, model_id: str, pinned: bool) -> ModelSlot:
        owner = self.owner(model_id)
        owner.set_pinned(pinned)
        self.events.emit("pinned" if pinned else "unpinned", model=model_id)
        return owner.slot

    def lease_lost(self, lease: Lease, reason: str) -> None:
        """GPUBoss could not keep ``lease``: its slot's owner stops serving from that VRAM."""
        for owner in list(self.owners.values()):
            owner.lease_lost(lease, reason)
        self.on_change()

    async def reap_expired(self) -> list[SlotKey]:
        stopped = []
        for owner in list(self.owners.values()):
            if owner.slot.evictable_state and owner.slot.expired(time.time()):
                if await owner.unload("stay-warm expired",
                                      only_if=lambda s: s.expired(time.time())):
                    stopped.append(owner.key)
        self.prune_replicas()
        return stopped

    async def reaper(self) -> None:
        """Background loop: unload slots past ``unload_at``. Never dies."""
        while True:
            await asyncio.sleep(self.settings.reaper_interval_s)
            try:
                await self.reap_expired()
            except Exception:
                log.exception("reaper pass failed; carrying on")

    async def health_monitor(self) -> None:
        """Background loop: health-check idle READY workers; unhealthy ones are stopped by
        their owners. Never dies."""
        while True:
            await asyncio.sleep(self.settings.health_interval_s)
            for owner in list(self.owners.values()):
                try:
                    await owner.check_health()
                except Exception:
                    log.exception("health check of %s failed; carrying on", owner.model_id)

    # -- shared services for the owners ---------------------------------------------------

    async def release_lease(self, lease: Lease | None, model_id: str) -> None:
        if lease is not None:
            try:
                await self.boss.release(lease.id)
            except Exception as exc:  # the lease will expire without its heartbeat anyway
                log.warning("releasing lease %s of %s failed: %s", lease.id, model_id, exc)

    async def learn_footprint(self, slot: ModelSlot, backend: InferenceBackend) -> None:
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
        lease = slot.lease
        if not vram and self.boss.nvml is not None and backend.pid and lease:
            used = [self.boss.nvml.process_used_mb(gpu, {backend.pid}) for gpu in lease.gpus]
            vram = sum(u for u in used if u) or None
        footprint = vram or report.get("footprint_mb")
        if footprint:
            slot.measured_mb = int(footprint)
        if vram:
            self.learned.observe_vram(slot.model_id, int(vram), partial_layers(
                slot.placement, slot.entry.manifest.gpu_layers))
        if footprint:
            self.events.emit("measured", model=slot.model_id, mb=int(footprint),
                             vram=bool(vram), loads_from_disk=report.get("loads_from_disk"))

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run ``coro`` as a background task the pool owns (cancelled at shutdown)."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_failure)
        return task

    async def shutdown(self) -> None:
        """Stop every worker and release every lease."""
        await self.spares.shutdown()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        for owner in list(self.owners.values()):
            await owner.shutdown()
        await self.templates.shutdown()  # after the workers: its own go with it

    def offloaded_mb(self) -> int:
        return self.cpu_tier.offloaded_mb()

    def status(self) -> list[dict]:
        return pool_status(self)


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("background task %s failed: %s", task.get_name(), task.exception())
