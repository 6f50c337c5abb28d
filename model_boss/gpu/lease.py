"""Leases: who holds how much VRAM on which GPUs, until when."""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Protocol


@dataclass(slots=True)
class Lease:
    """A grant of VRAM on one or more GPUs. ``allocations`` maps GPU index → MB.

    ``holder`` names who holds it (the name it was taken with); ``address`` is where a lease
    taken over the HTTP API was asked from (the caller's IP), empty for one taken in-process.
    """

    id: str
    holder: str
    kind: str
    allocations: dict[int, int]
    priority: int = 5
    ttl_s: float = 30.0
    expires_at: float = 0.0
    created_at: float = field(default_factory=time.time)
    note: str = ""
    address: str = ""

    @property
    def vram_mb(self) -> int:
        return sum(self.allocations.values())

    @property
    def gpus(self) -> list[int]:
        return sorted(self.allocations)

    def expired(self, now: float | None = None) -> bool:
        return (now if now is not None else time.time()) >= self.expires_at

    def to_dict(self) -> dict:
        data = asdict(self)
        data["allocations"] = {str(k): v for k, v in self.allocations.items()}
        data["vram_mb"] = self.vram_mb
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Lease:
        return cls(
            id=data["id"],
            holder=data["holder"],
            kind=data["kind"],
            allocations={int(k): int(v) for k, v in data["allocations"].items()},
            priority=int(data.get("priority", 5)),
            ttl_s=float(data.get("ttl_s", 30.0)),
            expires_at=float(data.get("expires_at", 0.0)),
            created_at=float(data.get("created_at", 0.0)),
            note=data.get("note", ""),
            address=data.get("address", ""),
        )


def new_lease_id() -> str:
    return "lease-" + uuid.uuid4().hex[:16]


class LeaseStore(Protocol):
    """Where leases live. ``acquire`` is atomic and all-or-nothing across GPUs.

    ``limits`` maps GPU index → the MB that leases may hold there in total (capacity minus
    margin). A lease whose ``expires_at`` has passed counts for nothing and is reclaimed.
    """

    async def acquire(self, lease: Lease, limits: dict[int, int]) -> bool: ...

    async def reassert(self, lease: Lease, limits: dict[int, int]) -> bool:
        """Put back a lease the store lost (a Redis restart), under its own id.

        The same atomic check as ``acquire``: written, with a fresh expiry, only if it fits
        beside the live leases; a live lease with the same id is replaced, not counted twice.
        """
        ...

    async def renew(self, lease_id: str, ttl_s: float) -> Lease | None: ...

    async def release(self, lease_id: str) -> bool: ...

    async def list(self) -> list[Lease]: ...

    async def publish_inventory(self, gpus: list[dict]) -> None: ...

    async def inventory(self) -> list[dict]: ...

    async def close(self) -> None: ...
