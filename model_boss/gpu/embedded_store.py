"""The embedded lease store: one process, no Redis. The default."""

from __future__ import annotations

import asyncio
import time

from .lease import Lease


class EmbeddedLeaseStore:
    """Leases in a dict behind an asyncio lock; atomic because nothing else shares it."""

    def __init__(self) -> None:
        self._leases: dict[str, Lease] = {}
        self._inventory: list[dict] = []
        self._lock = asyncio.Lock()

    def _reap(self, now: float) -> None:
        for lease_id in [i for i, lease in self._leases.items() if lease.expired(now)]:
            del self._leases[lease_id]

    async def acquire(self, lease: Lease, limits: dict[int, int]) -> bool:
        async with self._lock:
            now = time.time()
            self._reap(now)
            used: dict[int, int] = {}
            for held in self._leases.values():
                if held.id == lease.id:  # a re-asserted lease replaces itself
                    continue
                for gpu, mb in held.allocations.items():
                    used[gpu] = used.get(gpu, 0) + mb
            for gpu in sorted(lease.allocations):
                if gpu not in limits:
                    return False
                if used.get(gpu, 0) + lease.allocations[gpu] > limits[gpu]:
                    return False
            lease.expires_at = now + lease.ttl_s
            self._leases[lease.id] = lease
            return True

    async def reassert(self, lease: Lease, limits: dict[int, int]) -> bool:
        """``acquire`` under the lease's own id (see :meth:`LeaseStore.reassert`)."""
        return await self.acquire(lease, limits)

    async def renew(self, lease_id: str, ttl_s: float) -> Lease | None:
        async with self._lock:
            now = time.time()
            self._reap(now)
            lease = self._leases.get(lease_id)
            if lease is None:
                return None
            lease.ttl_s = ttl_s
            lease.expires_at = now + ttl_s
            return lease

    async def release(self, lease_id: str) -> bool:
        async with self._lock:
            return self._leases.pop(lease_id, None) is not None

    async def list(self) -> list[Lease]:
        async with self._lock:
            self._reap(time.time())
            return list(self._leases.values())

    async def publish_inventory(self, gpus: list[dict]) -> None:
        self._inventory = list(gpus)

    async def inventory(self) -> list[dict]:
        return list(self._inventory)

    async def close(self) -> None:
        return None
