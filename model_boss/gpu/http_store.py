"""HttpLeaseStore: the lease store behind a daemon's HTTP lease API, for outside processes."""

from __future__ import annotations

import httpx

from ..errors import BadRequest, StoreUnavailable
from .lease import Lease


class HttpLeaseStore:
    """``GPUBoss.from_url("http://127.0.0.1:8210")``: the daemon enforces the limits."""

    def __init__(self, base_url: str, api_key: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self._client = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=30,
                                         transport=transport)

    async def _call(self, method: str, path: str, json: dict | None = None) -> httpx.Response:
        try:
            return await self._client.request(method, path, json=json)
        except httpx.TransportError as exc:
            raise StoreUnavailable(f"lease API at {self.base_url} unreachable: {exc}",
                                   retry_after_s=5) from exc

    async def acquire(self, lease: Lease, limits: dict[int, int]) -> bool:
        response = await self._call("POST", "/api/v1/leases", {
            "kind": lease.kind, "holder": lease.holder, "priority": lease.priority,
            "allocations": {str(k): v for k, v in lease.allocations.items()},
            "ttl_s": lease.ttl_s, "note": lease.note})
        if response.status_code == 503:
            return False
        if response.status_code >= 400:
            raise BadRequest(response.json().get("error", {}).get("message", response.text))
        granted = Lease.from_dict(response.json())
        lease.id, lease.expires_at = granted.id, granted.expires_at
        return True

    async def renew(self, lease_id: str, ttl_s: float) -> Lease | None:
        response = await self._call("POST", f"/api/v1/leases/{lease_id}/renew",
                                    {"ttl_s": ttl_s})
        return Lease.from_dict(response.json()) if response.status_code == 200 else None

    async def release(self, lease_id: str) -> bool:
        return (await self._call("DELETE", f"/api/v1/leases/{lease_id}")).status_code == 200

    async def list(self) -> list[Lease]:
        response = await self._call("GET", "/api/v1/leases")
        return [Lease.from_dict(item) for item in response.json()["leases"]]

    async def publish_inventory(self, gpus: list[dict]) -> None:
        return None  # the daemon owns the inventory

    async def inventory(self) -> list[dict]:
        return (await self._call("GET", "/api/v1/gpus")).json()["gpus"]

    async def close(self) -> None:
        await self._client.aclose()
