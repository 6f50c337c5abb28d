"""GPUBoss: the VRAM lease coordinator every model and outside job goes through."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable

from ..errors import BadRequest, LeaseNotFound, LeaseUnavailable
from .embedded_store import EmbeddedLeaseStore
from .inventory import GPUInfo, GPUUsage, NvmlProbe
from .lease import Lease, LeaseStore, new_lease_id

log = logging.getLogger(__name__)

LeaseLost = Callable[[Lease, str], None]


def default_holder(tag: str = "client") -> str:
    return f"{tag}@{socket.gethostname()}:{os.getpid()}"


class GPUBoss:
    """Grants, renews and releases VRAM leases over a :class:`LeaseStore`.

    A holder that dies stops renewing and its leases expire after their TTL. Leases this
    instance acquires (``heartbeat=True``) are kept by a heartbeat that beats every third of
    the shortest TTL it keeps (leases held, and ``ttl_s`` once the inventory is published),
    but no more often than every 0.2 s. Each beat, for each held lease:

    - renewed: nothing more to do;
    - missing from the store (a Redis restart without persistence): re-asserted under the
      same id, holder, allocations, priority and TTL if it still fits beside the live leases;
    - lost: when it cannot be re-asserted (its VRAM was taken meanwhile), or when it has gone
      unrenewed for longer than its TTL (the store may have expired it, and another holder
      may then legitimately hold that VRAM). A lost lease leaves :meth:`holds` and
      ``on_lease_lost(lease, reason)`` is called once; whoever runs on that VRAM must stop.
    - a store error short of that (Redis down) is retried on the next beat.

    After :meth:`publish_inventory` each beat also re-publishes the inventory if the store
    no longer has it.
    """

    #: Called (synchronously, at most once per lease) when a held lease is lost; its
    #: exceptions are logged and swallowed.
    on_lease_lost: LeaseLost | None

    def __init__(
        self,
        store: LeaseStore,
        gpus: list[GPUInfo],
        *,
        margin_mb: int = 512,
        nvml: NvmlProbe | None = None,
        ttl_s: float = 30.0,
        holder: str | None = None,
    ) -> None:
        self.store = store
        self.gpus = sorted(gpus, key=lambda g: g.index)
        self.margin_mb = margin_mb
        self.nvml = nvml
        self.ttl_s = ttl_s
        self.holder = holder or default_holder("model-boss")
        self.on_lease_lost = None
        self._held: dict[str, Lease] = {}
        self._renewed_at: dict[str, float] = {}  # lease id → monotonic time of the last renewal
        self._inventory_published = False
        self._heartbeat: asyncio.Task | None = None
        self._wake = asyncio.Event()  # a new lease may shorten the beat; close() ends it
        self._closing = False

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: str = "", *, gpus: list[GPUInfo] | None = None,
                 margin_mb: int = 512, ttl_s: float = 30.0,
                 holder: str | None = None) -> GPUBoss:
        """A GPUBoss over ``redis://…`` (shared store) or ``http(s)://…`` (a daemon's API).

        With no ``gpus`` the inventory the daemon published to the store is used.
        """
        if url.startswith(("redis://", "rediss://", "unix://")):
            from .redis_store import RedisLeaseStore

            store: LeaseStore = RedisLeaseStore(url)
        elif url.startswith(("http://", "https://")):
            from .http_store import HttpLeaseStore

            store = HttpLeaseStore(url)
        elif not url:
            store = EmbeddedLeaseStore()
        else:
            raise BadRequest(f"unsupported lease store URL: {url!r}")
        return cls(store, gpus or [], margin_mb=margin_mb, ttl_s=ttl_s,
                   holder=holder or default_holder())

    async def _ensure_inventory(self) -> None:
        if self.gpus:
            return
        published = await self.store.inventory()
        self.gpus = [
            GPUInfo(int(g["index"]), g.get("name", "gpu"), int(g["vram_mb"]),
                    g.get("source", "published"))
            for g in published
        ]
        if not self.gpus:
            raise LeaseUnavailable("no GPU inventory: the daemon has not published one to "
                                   "this store and none was given")

    async def publish_inventory(self) -> None:
        """Publish the GPU list for clients without one; the heartbeat puts it back if lost."""
        self._inventory_published = True
        self._start_heartbeat()
        await self.store.publish_inventory([g.to_dict() for g in self.gpus])

    async def _keep_inventory(self) -> None:
        try:
            if not await self.store.inventory():
                await self.store.publish_inventory([g.to_dict() for g in self.gpus])
                log.warning("GPU inventory was missing from the lease store; re-published")
        except Exception as exc:
            log.warning("checking the published GPU inventory failed (retrying next beat): %s",
                        exc)

    # -- accounting -----------------------------------------------------------------------

    def limits(self) -> dict[int, int]:
        return {g.index: max(0, g.vram_mb - self.margin_mb) for g in self.gpus}

    async def usage(self) -> list[GPUUsage]:
        await self._ensure_inventory()
        leases = await self.store.list()
        leased: dict[int, int] = {}
        for lease in leases:
            for gpu, mb in lease.allocations.items():
                leased[gpu] = leased.get(gpu, 0) + mb
        result = []
        for g in self.gpus:
            free = g.vram_mb - leased.get(g.index, 0) - self.margin_mb
            nvml_free = None
            if self.nvml is not None:
                try:
                    nvml_free = self.nvml.free_mb(g.index)
                    free = min(free, nvml_free - self.margin_mb)
                except Exception as exc:
                    log.warning("NVML free-memory read failed on GPU %d: %s", g.index, exc)
            result.append(GPUUsage(g.index, g.name, g.vram_mb, leased.get(g.index, 0),
                                   max(0, free), nvml_free, g.source, self.margin_mb))
        return result

    async def free_mb(self) -> dict[int, int]:
        return {u.index: u.free_mb for u in await self.usage()}

    # -- leases ---------------------------------------------------------------------------

    async def acquire(
        self,
        *,
        kind: str,
        allocations: dict[int, int] | None = None,
        vram_mb: int | None = None,
        gpu: int | None = None,
        priority: int = 5,
        ttl_s: float | None = None,
        holder: str | None = None,
        note: str = "",
        address: str = "",
        heartbeat: bool = True,
    ) -> Lease:
        """Take a lease, all-or-nothing; raise :class:`LeaseUnavailable` when it cannot fit.

        Give ``allocations`` ({gpu: MB}) or ``vram_mb`` (on ``gpu``, else the GPU with the
        most free VRAM). ``address``: where an HTTP caller asked from, kept beside ``holder``.
        """
        await self._ensure_inventory()
        if allocations is None:
            if vram_mb is None or vram_mb <= 0:
                raise BadRequest("a lease needs vram_mb > 0 or allocations", param="vram_mb")
            if gpu is None:
                free = await self.free_mb()
                gpu = max(free, key=lambda i: (free[i], -i))
            allocations = {gpu: vram_mb}
        allocations = self._checked(allocations)
        if self.nvml is not None:
            free = await self.free_mb()
            short = [i for i, mb in sorted(allocations.items()) if mb > free.get(i, 0)]
            if short:
                raise LeaseUnavailable(
                    f"GPU {short[0]} has {free.get(short[0], 0)} MB free, "
                    f"{allocations[short[0]]} MB asked", retry_after_s=5)
        sent = time.monotonic()
        lease = Lease(
            id=new_lease_id(), holder=holder or self.holder, kind=kind,
            allocations=dict(sorted(allocations.items())), priority=priority,
            ttl_s=ttl_s or self.ttl_s, note=note, address=address,
        )
        if not await self.store.acquire(lease, self.limits()):
            asked = ", ".join(f"GPU {i}: {mb} MB" for i, mb in lease.allocations.items())
            raise LeaseUnavailable(f"not enough free VRAM for {asked}", retry_after_s=5)
        if heartbeat:
            self._keep(lease, sent)
        log.info("lease %s granted to %s (%s): %s", lease.id, lease.holder, kind,
                 lease.allocations)
        return lease

    def _checked(self, allocations: dict[int, int]) -> dict[int, int]:
        """``allocations`` above 0 MB, on known GPUs, in GPU index order."""
        known = {g.index for g in self.gpus}
        allocations = {int(k): int(v) for k, v in allocations.items() if int(v) > 0}
        if not allocations:
            raise BadRequest("a lease needs at least one allocation above 0 MB",
                             param="allocations")
        unknown = sorted(set(allocations) - known)
        if unknown:
            raise BadRequest(f"unknown GPU index {unknown[0]}; GPUs: {sorted(known)}",
                             param="gpu")
        return dict(sorted(allocations.items()))

    async def reassert(self, lease: Lease) -> bool:
        """Put back ``lease`` (same id) that the store lost, if it fits; False if it does not.

        Only the lease limits are checked, not NVML free memory: the holder's model is
        still loaded, so the driver already counts it as used.
        """
        await self._ensure_inventory()
        lease.allocations = self._checked(lease.allocations)
        return await self.store.reassert(lease, self.limits())

    def holds(self, lease_id: str) -> bool:
        """Whether this instance still keeps ``lease_id`` alive (acquired, not released/lost)."""
        return lease_id in self._held

    async def renew(self, lease_id: str, ttl_s: float | None = None) -> Lease:
        """Renew a lease; one this instance holds is re-asserted if the store lost it."""
        sent = time.monotonic()
        lease = await self.store.renew(lease_id, ttl_s or self.ttl_s)
        held = self._held.get(lease_id)
        if lease is None and held is not None and await self._recover(held, sent):
            return held
        if lease is None:
            raise LeaseNotFound(f"lease {lease_id} does not exist or has expired")
        if held is not None:
            self._renewed_at[lease_id] = sent
        return lease

    async def release(self, lease_id: str) -> bool:
        self._held.pop(lease_id, None)
        self._renewed_at.pop(lease_id, None)
        released = await self.store.release(lease_id)
        if released:
            log.info("lease %s released", lease_id)
        return released

    async def leases(self) -> list[Lease]:
        return await self.store.list()

    @contextlib.asynccontextmanager
    async def lease(self, **kwargs) -> AsyncIterator[Lease]:
        """``async with boss.lease(vram_mb=..., kind="training") as lease:`` — released after."""
        taken = await self.acquire(**kwargs)
        try:
            yield taken
        finally:
            await self.release(taken.id)

    # -- heartbeat ------------------------------------------------------------------------

    def _keep(self, lease: Lease, renewed_at: float) -> None:
        self._held[lease.id] = lease
        self._renewed_at[lease.id] = renewed_at
        self._wake.set()
        self._start_heartbeat()

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.create_task(self._heartbeat_loop(), name="gpuboss-heartbeat")

    def _interval(self) -> float:
        ttls = [lease.ttl_s for lease in self._held.values()]
        if self._inventory_published:
            ttls.append(self.ttl_s)
        return max(0.2, min(ttls, default=self.ttl_s) / 3)

    async def _heartbeat_loop(self) -> None:
        last = time.monotonic()
        while not self._closing and (self._held or self._inventory_published):
            wait = last + self._interval() - time.monotonic()
            if wait > 0:  # woken early by a new lease: its TTL may shorten the interval
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
                continue
            last = time.monotonic()
            try:
                await self.beat()
            except Exception:  # a heartbeat never dies; the next beat retries
                log.exception("GPUBoss heartbeat failed")

    async def beat(self) -> None:
        """One heartbeat: renew (or re-assert, or give up) every held lease; keep the inventory."""
        for lease in list(self._held.values()):
            if lease.id not in self._held:  # released during this beat
                continue
            sent = time.monotonic()
            try:
                renewed = await self.store.renew(lease.id, lease.ttl_s)
            except Exception as exc:
                self._renewal_failed(lease, sent, exc)
                continue
            if renewed is not None:
                lease.expires_at = renewed.expires_at
                if lease.id in self._held:
                    self._renewed_at[lease.id] = sent
            else:
                await self._recover(lease, sent)
        if self._inventory_published:
            await self._keep_inventory()

    def _unrenewed_s(self, lease: Lease, now: float) -> float:
        return now - self._renewed_at.get(lease.id, now)

    def _renewal_failed(self, lease: Lease, sent: float, exc: Exception) -> None:
        unrenewed = self._unrenewed_s(lease, sent)
        if unrenewed > lease.ttl_s:
            self._lose(lease, f"not renewed for {unrenewed:.1f}s, longer than its "
                              f"{lease.ttl_s:g}s TTL ({exc})")
        else:
            log.warning("renewing lease %s failed (retrying next beat; lost after %gs "
                        "unrenewed): %s", lease.id, lease.ttl_s, exc)

    async def _recover(self, lease: Lease, sent: float) -> bool:
        """The store no longer has ``lease``: re-assert it, or declare it lost. True if back."""
        unrenewed = self._unrenewed_s(lease, sent)
        if lease.id not in self._held:  # released meanwhile: nothing to keep
            return False
        if unrenewed > lease.ttl_s:
            self._lose(lease, f"expired: not renewed for {unrenewed:.1f}s, longer than its "
                              f"{lease.ttl_s:g}s TTL")
            return False
        try:
            back = await self.reassert(lease)
        except Exception as exc:
            self._renewal_failed(lease, sent, exc)
            return False
        if not back:
            self._lose(lease, "missing from the lease store, and its VRAM was taken before it "
                              "could be re-asserted")
            return False
        if lease.id not in self._held:  # released while being re-asserted: undo
            with contextlib.suppress(Exception):
                await self.store.release(lease.id)
            return False
        self._renewed_at[lease.id] = sent
        log.warning("lease %s (%s, %s) was missing from the lease store; re-asserted: %s",
                    lease.id, lease.holder, lease.kind, lease.allocations)
        return True

    def _lose(self, lease: Lease, reason: str) -> None:
        if self._held.pop(lease.id, None) is None:
            return  # already released or lost: the callback fires once
        self._renewed_at.pop(lease.id, None)
        log.error("lease %s (%s, %s) lost: %s", lease.id, lease.holder, lease.kind, reason)
        if self.on_lease_lost is not None:
            try:
                self.on_lease_lost(lease, reason)
            except Exception:
                log.exception("on_lease_lost failed for lease %s", lease.id)

    async def close(self, release_held: bool = True) -> None:
        """Stop the heartbeat and (by default) release every lease this instance holds."""
        if self._heartbeat is not None:
            # The flag too: redis-py can swallow a cancel that lands mid-command.
            self._closing = True
            self._wake.set()
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._heartbeat
            self._heartbeat = None
            self._closing = False
        self._inventory_published = False
        if release_held:
            for lease_id in list(self._held):
                with contextlib.suppress(Exception):
                    await self.release(lease_id)
        await self.store.close()
