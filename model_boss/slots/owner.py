"""SlotOwner: the one writer of a ModelSlot's state, lease and worker process.

Everyone else asks it. Requests call :meth:`try_acquire` / :meth:`release` (synchronous, so a grant
is decided with no ``await`` between the check and the count); lifecycle callers call
:meth:`ensure_ready`, :meth:`evict`, :meth:`offload` and :meth:`unload`, run as one *operation*
task at a time per slot (a second caller joins a load, or waits). The state that blocks new grants
(DRAINING, OFFLOADING, STOPPING) is set before an operation's first ``await``. A crash, a lost
lease or a dead process found at grant time take the slot out of READY synchronously.

Waiters: every request queued for the model and every :meth:`ensure_ready` caller (an admin load, a
preload) counts as one. When the last one gives up (a client gone, a job cancelled) while a cold
load is still cancellable, the owner cancels it: worker stopped, lease released, slot IDLE.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ..backends.base import InferenceBackend, exit_story
from ..errors import CapacityExceeded, LoadFailed, ModelBossError, ModelBusy
from ..gpu.lease import Lease
from ..slot_key import SlotKey
from .loading import SlotLoad
from .progress import LoadProgress
from .slot import WITH_WORKER, ModelSlot, SlotState

if TYPE_CHECKING:
    from .host import SlotHost

log = logging.getLogger(__name__)

S = SlotState
MAX_LOAD_TRIES = 3  # loads one ensure_ready starts when the worker keeps dying right after


class SlotOwner:
    """Drives one :class:`ModelSlot`. Nothing else changes the slot's state, lease or worker."""

    def __init__(self, slot: ModelSlot, pool: SlotHost) -> None:
        self.slot = slot
        self.pool = pool
        self._op: asyncio.Task | None = None
        self._op_kind = ""
        self._drained = asyncio.Event()
        self._drained.set()
        self._health_failures = 0
        self._load: SlotLoad | None = None
        self._waiters = 0

    @property
    def model_id(self) -> str:
        return self.slot.model_id

    @property
    def key(self) -> SlotKey:
        """Its copy's key (the model's id for the first copy, ``id#n`` for replica n)."""
        return self.slot.key

    @property
    def busy(self) -> bool:
        """An operation (load, offload, stop) is in flight."""
        return self._op is not None and not self._op.done()

    @property
    def loading(self) -> bool:
        return self.busy and self._op_kind == "load"

    @property
    def progress(self) -> LoadProgress | None:
        """The load in flight's progress; None when no load runs."""
        return self._load.progress if self.loading and self._load is not None else None

    @property
    def waiters(self) -> int:
        return self._waiters

    def wait_begins(self) -> None:
        """One more request (or ensure_ready caller) waits for this slot."""
        self._waiters += 1

    def wait_ends(self, gave_up: bool) -> None:
        """A waiter is done waiting; ``gave_up``: it went away before it was served. The
        last one to give up cancels a cold load nobody else wants."""
        self._waiters = max(0, self._waiters - 1)
        load = self._load
        if not gave_up or self._waiters or not self.loading or load is None \
                or not load.cancellable:
            return
        load.cancel_reason = "load cancelled: no request waits for it any more"
        assert self._op is not None
        self._op.cancel()

    # -- requests -------------------------------------------------------------------------

    def try_acquire(self, priority: int, keep_alive_s: float | None = None) -> bool:
        """Count one request against the slot if it is READY, leased, alive and has room."""
        s = self.slot
        if s.state != S.READY or s.active >= s.parallel:
            return False
        if s.lease is None and s.backend is not None and s.backend.needs_vram:
            if not self.busy:
                self._stop_now("READY without a lease")
            return False
        if s.backend is None or not s.backend.alive:
            self._lose_worker("worker process is not alive", "worker_crashed")
            return False
        s.active += 1
        self._drained.clear()
        s.granted(priority, keep_alive_s)
        return True

    def release(self, priority: int, keep_alive_s: float | None = None) -> None:
        """One request on the slot ended; honours its keep-alive."""
        s = self.slot
        s.active = max(0, s.active - 1)
        s.finished(priority, keep_alive_s)
        if s.active == 0:
            self._drained.set()
            if s.unload_after_request and not s.pinned and not s.holds:
                s.unload_after_request = False
                self.pool.spawn(self._quiet(self.unload("keep_alive 0")))
        self.pool.on_change()

    def set_pinned(self, pinned: bool) -> None:
        self.slot.pinned = pinned
        self.slot.refresh_unload_at()

    def hold(self, holder: str, priority: int) -> None:
        """``holder`` (an open realtime session) uses the model until :meth:`let_go`: it
        does not expire, and only a request more important than ``priority`` may evict it."""
        self.slot.holds[holder] = priority
        self.slot.refresh_unload_at()
        self.pool.on_change()

    def let_go(self, holder: str) -> None:
        """``holder`` no longer uses the model: its stay-warm clock starts now."""
        if self.slot.holds.pop(holder, None) is not None:
            self.slot.refresh_unload_at()
            self.pool.on_change()

    # -- lifecycle: public ----------------------------------------------------------------

    async def ensure_ready(self, priority: int) -> ModelSlot:
        """The slot READY: joins a load in flight (never a second), waits out an offload or
        a stop, then loads (an OFFLOADED slot is onloaded)."""
        self.wait_begins()
        gave_up = False
        try:
            return await self._ready(priority)
        except asyncio.CancelledError:
            gave_up = True
            raise
        finally:
            self.wait_ends(gave_up)

    async def _ready(self, priority: int) -> ModelSlot:
        loads = 0
        while True:
            s = self.slot
            if s.state == S.READY:
                return s
            if not self.busy:
                if s.state not in (S.IDLE, S.OFFLOADED) or loads >= MAX_LOAD_TRIES:
                    raise LoadFailed(f"'{self.model_id}' is {s.state}; cannot load now",
                                     retry_after_s=2)
                loads += 1
                self.start_load(priority)
            op, kind = self._op, self._op_kind
            assert op is not None
            try:
                await asyncio.shield(op)
            except ModelBossError:
                if kind == "load":
                    raise
            except Exception as exc:
                if kind == "load":
                    raise LoadFailed(f"loading '{self.model_id}' failed: {exc}") from exc

    def start_load(self, priority: int) -> asyncio.Task | None:
        """Begin a load unless one is in flight (then that one); None: nothing to load now."""
        if self.busy:
            return self._op if self._op_kind == "load" else None
        if self.slot.state not in (S.IDLE, S.OFFLOADED):
            return None
        self._load = SlotLoad(self, priority)
        return self._begin("load", self._load.run())

    async def evict(self, reason: str) -> str | None:
        """Free this slot's VRAM for another model, if it is idle right now: park it in CPU RAM
        when its backend can and RAM allows, else stop it. Never waits for a busy slot.
        Returns the tier the slot ended in ("cpu" or "disk"), None when it was not evicted."""
        s = self.slot
        if self.busy or s.state != S.READY or s.active or s.pinned:
            return None
        # a second replica is not parked: its model is in RAM already, or on the first one
        offload = bool(s.backend is not None and s.backend.can_offload and s.replica == 1)
        s.transition(S.OFFLOADING if offload else S.STOPPING, f"evicted: {reason}")
        op = self._begin("offload" if offload else "stop", self._offload(reason) if offload
                         else self.stop_worker(f"evicted: {reason}"))
        tier = await asyncio.shield(op)
        self.pool.events.emit("evicted", model=self.model_id, reason=reason, tier=tier,
                              last_priority=s.last_priority)
        return tier

    async def unload(self, reason: str = "unload requested", *, wait_s: float = 0.0,
                     wait_for_op: bool = False,
                     only_if: Callable[[ModelSlot], bool] | None = None) -> bool:
        """Stop the worker (disk tier). With requests running: wait up to ``wait_s`` for them
        (no new grants meanwhile), else 409 ``model_busy``. False when there is nothing to do."""
        return await self._retire(S.STOPPING, reason, wait_s, wait_for_op, only_if)

    async def offload(self, reason: str = "offload requested", *, wait_s: float = 0.0) -> bool:
        """Move the weights to CPU RAM (READY → OFFLOADED), releasing the VRAM lease."""
        s = self.slot
        if s.backend is not None and not s.backend.can_offload:
            raise ModelBossError(f"'{self.model_id}' cannot be offloaded to CPU RAM",
                                 status_code=400, code="offload_unsupported")
        return await self._retire(S.OFFLOADING, reason, wait_s, True, None)

    # -- lifecycle: callbacks (synchronous) -----------------------------------------------

    def worker_exited(self, backend: InferenceBackend, code: int) -> None:
        """The worker died on its own. A load or stop in flight reports it itself."""
        if self.slot.backend is backend and self.slot.state in WITH_WORKER:
            self._lose_worker(exit_story(backend, code), "worker_crashed", code=code)

    def lease_lost(self, lease: Lease, reason: str) -> None:
        """GPUBoss could not keep the slot's lease: stop serving from that VRAM at once."""
        s = self.slot
        if s.lease is None or s.lease.id != lease.id:
            return
        self.pool.events.emit("lease_lost", model=self.model_id, lease=lease.id, reason=reason)
        if s.state == S.READY and not self.busy:
            self._stop_now(f"VRAM lease lost: {reason}")
        else:  # an operation is in flight: it checks the lease before READY
            s.lease = None

    async def check_health(self, failures_to_stop: int = 3) -> bool:
        """Ask an idle READY worker if it is healthy; ``failures_to_stop`` failures in a row
        and it leaves READY, its worker stopped (the next request reloads it)."""
        s, backend = self.slot, self.slot.backend
        if s.state != S.READY or self.busy or backend is None:
            return True
        healthy = await backend.health_check()
        if s.backend is not backend or s.state != S.READY:
            return True  # it moved on while we asked
        self._health_failures = 0 if healthy else self._health_failures + 1
        if self._health_failures >= failures_to_stop and s.active == 0 and not self.busy:
            self._health_failures = 0
            s.last_error = f"worker failed {failures_to_stop} health checks in a row"
            self.pool.events.emit("worker_unhealthy", model=self.model_id, pid=backend.pid)
            self._stop_now(s.last_error)
        return healthy

    # -- operations -----------------------------------------------------------------------

    def _begin(self, kind: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        self._op_kind = kind
        self._op = asyncio.create_task(coro, name=f"{kind}-{self.model_id}")
        self._op.add_done_callback(self._op_done)
        return self._op

    def _op_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()  # no room yet is routine: the waiters stay queued
            log.log(logging.DEBUG if isinstance(exc, CapacityExceeded) else logging.INFO,
                    "%s of %s failed: %s", self._op_kind, self.model_id, exc)
        self.pool.on_change()

    async def _retire(self, target: SlotState, reason: str, wait_s: float, wait_for_op: bool,
                      only_if: Callable[[ModelSlot], bool] | None) -> bool:
        """Take a READY (or OFFLOADED) slot to ``target`` (OFFLOADING or STOPPING)."""
        s = self.slot
        while self.busy:
            if not wait_for_op:
                return False
            with contextlib.suppress(Exception):
                await asyncio.shield(self._op)  # type: ignore[arg-type]
        if only_if is not None and not only_if(s):
            return False
        if s.state == S.OFFLOADED and target == S.STOPPING:
            s.transition(S.STOPPING, reason)
            await asyncio.shield(self._begin("stop", self.stop_worker(reason)))
            return True
        if s.state != S.READY:
            return False
        if s.active and wait_s <= 0:
            raise ModelBusy(self.model_id, s.active)
        s.transition(S.DRAINING if s.active else target, reason)
        return bool(await asyncio.shield(self._begin(
            "offload" if target == S.OFFLOADING else "stop",
            self._drain_then(target, reason, wait_s))))

    async def _drain_then(self, target: SlotState, reason: str, wait_s: float) -> str | None:
        s = self.slot
        if s.state == S.DRAINING:
            try:
                async with asyncio.timeout(wait_s):
                    while s.active:
                        await self._drained.wait()
            except TimeoutError:
                if s.state != S.DRAINING:
                    return None
                if s.lease is None and s.backend is not None and s.backend.needs_vram:
                    s.transition(S.STOPPING, "lease lost while draining")
                    return await self.stop_worker(f"{reason} (lease lost)")
                s.transition(S.READY, f"still busy after {wait_s:g}s")
                raise ModelBusy(self.model_id, s.active) from None
            if s.state != S.DRAINING:
                return None  # crashed while draining
            s.transition(target, reason)
        if target == S.OFFLOADING:
            return await self._offload(reason)
        return await self.stop_worker(reason)

    async def _offload(self, reason: str) -> str:
        """OFFLOADING → OFFLOADED (weights to RAM, lease released), or → disk when RAM is
        short or the worker refuses. Returns the tier the slot ends in."""
        s = self.slot
        backend = s.backend
        need = self.pool.footprint_mb(s)
        if not await self.pool.cpu_tier.make_room(need, exclude=self.model_id):
            self.pool.events.emit("offload_skipped", model=self.model_id, need_mb=need,
                                  ram_available_mb=self.pool.cpu_tier.ram_available_mb())
            return await self._stop_instead(reason)
        started = time.monotonic()
        try:
            assert backend is not None
            report = await backend.offload()
        except Exception as exc:
            if s.backend is not backend:
                return "disk"  # crashed meanwhile
            self.pool.events.emit("offload_failed", model=self.model_id, error=str(exc))
            return await self._stop_instead(reason)
        if s.backend is not backend or s.state != S.OFFLOADING:
            return "disk"
        lease, s.lease, s.placement = s.lease, None, None
        s.ram_reserved_mb = need
        s.transition(S.OFFLOADED, reason)
        await self.pool.release_lease(lease, self.model_id)
        self.pool.events.emit("offloaded", model=self.model_id, reason=reason, ram_mb=need,
                              seconds=round(time.monotonic() - started, 3),
                              worker_seconds=report.get("seconds"),
                              freed_mb=report.get("freed_mb"))
        return "cpu"

    async def _stop_instead(self, reason: str) -> str:
        if self.slot.state == S.OFFLOADING:
            self.slot.transition(S.STOPPING, f"{reason} (RAM tier unavailable)")
            return await self.stop_worker(reason)
        return "disk"

    async def stop_worker(self, reason: str, event: str = "unloaded") -> str:
        """STOPPING → IDLE: stop the worker, then release its lease (the VRAM is free only
        once the process is gone). Only this owner's operations (a load among them) call it."""
        s = self.slot
        backend, s.backend = s.backend, None
        lease, s.lease, s.placement = s.lease, None, None
        try:
            if backend is not None:
                if event == "unloaded":  # planned: a llama model saves its prompt caches
                    with contextlib.suppress(Exception):
                        await backend.retire()
                with contextlib.suppress(Exception):
                    await backend.stop()
        finally:
            await self.pool.release_lease(lease, self.model_id)
            s.port, s.ram_reserved_mb = None, 0
            if s.state == S.STOPPING:
                s.transition(S.IDLE, reason)
            fields = {"error": s.last_error} if event == "load_failed" else {"reason": reason}
            self.pool.events.emit(event, model=self.model_id, **fields)
        return "disk"

    def _stop_now(self, reason: str) -> None:
        """READY → STOPPING synchronously, the stop itself as this slot's operation."""
        self.slot.transition(S.STOPPING, reason)
        self._begin("stop", self.stop_worker(reason))

    def _lose_worker(self, why: str, event: str, **fields: Any) -> None:
        """The worker is gone (or unusable): IDLE at once; clean up in the background."""
        s = self.slot
        backend, s.backend = s.backend, None
        lease, s.lease, s.placement = s.lease, None, None
        s.port, s.ram_reserved_mb, s.last_error = None, 0, why
        s.transition(S.IDLE, why)
        self.pool.events.emit(event, model=self.model_id, reason=why,
                              pid=backend.pid if backend else None, **fields)
        self.pool.spawn(self._cleanup(backend, lease))

    async def _cleanup(self, backend: InferenceBackend | None, lease: Lease | None) -> None:
        if backend is not None:
            with contextlib.suppress(Exception):
                await backend.stop()
        await self.pool.release_lease(lease, self.model_id)
        self.pool.on_change()

    async def _quiet(self, coro: Coroutine[Any, Any, Any]) -> None:
        with contextlib.suppress(ModelBossError):
            await coro

    async def shutdown(self) -> None:
        """Stop whatever runs: cancel an operation in flight, stop the worker, free the lease."""
        if self._op is not None and not self._op.done():
            self._op.cancel()
            with contextlib.suppress(BaseException):
                await self._op
        if self.slot.state in WITH_WORKER or self.slot.state == S.LOADING:
            self.slot.transition(S.STOPPING, "shutdown")
        await self.stop_worker("shutdown")
