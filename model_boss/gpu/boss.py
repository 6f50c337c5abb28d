"""GPUBoss: the VRAM lease coordinator every model and outside job goes through."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ..errors import BadRequest, LeaseNotFound, LeaseUnavailable
from .embedded_store import EmbeddedLeaseStore
from .inventory import GPUInfo, NvmlProbe
from .lease import Lease, LeaseStore, new_lease_id

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GPUUsage:
    """One GPU as the scheduler sees it right now."""

    index: int
    name: str
    capacity_mb: int
    leased_mb: int
    free_mb: int  # effective: min(capacity - leased - margin, NVML free - margin), >= 0
    nvml_free_mb: int | None
    source: str

    def to_dict(self) -> dict:
        return {
            "index": self.index,
            "name": self.name,
            "capacity_mb": self.capacity_mb,
            "leased_mb": self.leased_mb,
            "free_mb": self.free_mb,
            "nvml_free_mb": self.nvml_free_mb,
            "source": self.source,
        }


def default_holder(tag: str = "client") -> str:
    return f"{tag}@{socket.gethostname()}:{os.getpid()}"


class GPUBoss:
    """Grants, renews and releases VRAM leases over a :class:`LeaseStore`.

    Leases this instance acquires are renewed by a heartbeat every ``ttl/3`` seconds; a holder
    that dies stops renewing and its leases expire after their TTL.
    """

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
        self._held: dict[str, Lease] = {}
        self._heartbeat: asyncio.Task | None = None

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
        await self.store.publish_inventory([g.to_dict() for g in self.gpus])

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
                                   max(0, free), nvml_free, g.source))
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
        heartbeat: bool = True,
    ) -> Lease:
        """Take a lease, all-or-nothing; raise :class:`LeaseUnavailable` when it cannot fit.

        Give ``allocations`` ({gpu: MB}) or ``vram_mb`` (on ``gpu``, else the GPU with the
        most free VRAM).
        """
        await self._ensure_inventory()
        known = {g.index for g in self.gpus}
        if allocations is None:
            if vram_mb is None or vram_mb <= 0:
                raise BadRequest("a lease needs vram_mb > 0 or allocations", param="vram_mb")
            if gpu is None:
                free = await self.free_mb()
                gpu = max(free, key=lambda i: (free[i], -i))
            allocations = {gpu: vram_mb}
        allocations = {int(k): int(v) for k, v in allocations.items() if int(v) > 0}
        if not allocations:
            raise BadRequest("a lease needs at least one allocation above 0 MB",
                             param="allocations")
        unknown = sorted(set(allocations) - known)
        if unknown:
            raise BadRequest(f"unknown GPU index {unknown[0]}; GPUs: {sorted(known)}",
                             param="gpu")
        if self.nvml is not None:
            free = await self.free_mb()
            short = [i for i, mb in sorted(allocations.items()) if mb > free.get(i, 0)]
            if short:
                raise LeaseUnavailable(
                    f"GPU {short[0]} has {free.get(short[0], 0)} MB free, "
                    f"{allocations[short[0]]} MB asked", retry_after_s=5)
        lease = Lease(
            id=new_lease_id(), holder=holder or self.holder, kind=kind,
            allocations=dict(sorted(allocations.items())), priority=priority,
            ttl_s=ttl_s or self.ttl_s, note=note,
        )
        if not await self.store.acquire(lease, self.limits()):
            asked = ", ".join(f"GPU {i}: {mb} MB" for i, mb in lease.allocations.items())
            raise LeaseUnavailable(f"not enough free VRAM for {asked}", retry_after_s=5)
        if heartbeat:
            self._held[lease.id] = lease
            self._start_heartbeat()
        log.info("lease %s granted to %s (%s): %s", lease.id, lease.holder, kind,
                 lease.allocations)
        return lease

    async def renew(self, lease_id: str, ttl_s: float | None = None) -> Lease:
        lease = await self.store.renew(lease_id, ttl_s or self.ttl_s)
        if lease is None:
            self._held.pop(lease_id, None)
            raise LeaseNotFound(f"lease {lease_id} does not exist or has expired")
        return lease

    async def release(self, lease_id: str) -> bool:
        self._held.pop(lease_id, None)
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

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.create_task(self._heartbeat_loop(), name="gpuboss-heartbeat")

    async def _heartbeat_loop(self) -> None:
        while self._held:
            await asyncio.sleep(max(0.2, min(lease.ttl_s for lease in self._held.values()) / 3))
            for lease in list(self._held.values()):
                try:
                    if await self.store.renew(lease.id, lease.ttl_s) is None:
                        log.error("lease %s was lost (expired before renewal)", lease.id)
                        self._held.pop(lease.id, None)
                except Exception as exc:  # a heartbeat never dies; the next beat retries
                    log.warning("renewing lease %s failed: %s", lease.id, exc)

    async def close(self, release_held: bool = True) -> None:
        """Stop the heartbeat and (by default) release every lease this instance holds."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._heartbeat
            self._heartbeat = None
        if release_held:
            for lease_id in list(self._held):
                with contextlib.suppress(Exception):
                    await self.release(lease_id)
        await self.store.close()
