"""HttpLeaseStore: the lease store behind a daemon's HTTP lease API, for outside processes."""

from __future__ import annotations

import os
from typing import Any

import httpx

from ..errors import (
    BadRequest,
    LeaseNotFound,
    LeaseUnavailable,
    ModelBossError,
    StoreUnavailable,
    Unauthorized,
)
from .lease import Lease

# Error codes the daemon sends back, turned into the same exceptions on this side.
_ERRORS: dict[str, type[ModelBossError]] = {
    "invalid_request": BadRequest,
    "invalid_api_key": Unauthorized,
    "lease_not_found": LeaseNotFound,
    "lease_unavailable": LeaseUnavailable,
    "store_unavailable": StoreUnavailable,
}


class HttpLeaseStore:
    """``GPUBoss.from_url("http://127.0.0.1:8210")``: the daemon grants and enforces leases.

    The API key defaults to ``MODEL_BOSS_ADMIN_API_KEY`` or ``MODEL_BOSS_API_KEY`` from the
    environment (the lease API lives under ``/api/``). ``transport`` is the seam tests use to
    talk to an app in-process.
    """

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout_s: float = 30.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        if api_key is None:
            api_key = (os.environ.get("MODEL_BOSS_ADMIN_API_KEY")
                       or os.environ.get("MODEL_BOSS_API_KEY"))
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self._client = httpx.AsyncClient(base_url=self.base_url, headers=headers,
                                         timeout=timeout_s, transport=transport)

    async def _call(self, method: str, path: str, json: dict | None = None) -> httpx.Response:
        try:
            return await self._client.request(method, path, json=json)
        except httpx.TransportError as exc:
            raise StoreUnavailable(f"lease API at {self.base_url} unreachable: {exc}",
                                   retry_after_s=5) from exc

    def _error(self, response: httpx.Response) -> ModelBossError:
        """The daemon's error envelope as the matching :class:`ModelBossError`."""
        try:
            error: dict[str, Any] = response.json().get("error") or {}
        except (ValueError, AttributeError):
            error = {}
        message = error.get("message") or f"lease API answered {response.status_code}: " \
            f"{response.text[:200]}"
        retry_after = response.headers.get("retry-after", "")
        kind = _ERRORS.get(error.get("code") or "", ModelBossError)
        return kind(message, param=error.get("param"), code=error.get("code"),
                    status_code=response.status_code,
                    retry_after_s=float(retry_after) if retry_after.isdigit() else None)

    def _gone(self, response: httpx.Response) -> bool:
        """The daemon says this lease does not exist (released, expired, never granted)."""
        return response.status_code == 404 and isinstance(self._error(response), LeaseNotFound)

    def _json(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            raise self._error(response)
        try:
            return response.json()
        except ValueError as exc:
            raise StoreUnavailable(f"lease API at {self.base_url} answered non-JSON: "
                                   f"{response.text[:200]}") from exc

    def _refused(self, response: httpx.Response) -> bool:
        """The daemon says the lease does not fit (503 ``lease_unavailable``)."""
        return response.status_code == 503 \
            and isinstance(self._error(response), LeaseUnavailable)

    @staticmethod
    def _terms(lease: Lease) -> dict[str, Any]:
        return {"kind": lease.kind, "holder": lease.holder, "priority": lease.priority,
                "allocations": {str(k): v for k, v in lease.allocations.items()},
                "ttl_s": lease.ttl_s, "note": lease.note}

    async def acquire(self, lease: Lease, limits: dict[int, int]) -> bool:
        """POST the lease; the daemon checks its own limits (``limits`` is not sent)."""
        response = await self._call("POST", "/api/v1/leases", self._terms(lease))
        if self._refused(response):
            return False
        granted = Lease.from_dict(self._json(response))
        lease.id, lease.expires_at = granted.id, granted.expires_at
        lease.created_at = granted.created_at
        return True

    async def reassert(self, lease: Lease, limits: dict[int, int]) -> bool:
        """PUT the lease under its own id; the daemon checks its own limits."""
        response = await self._call("PUT", f"/api/v1/leases/{lease.id}", self._terms(lease))
        if self._refused(response):
            return False
        lease.expires_at = Lease.from_dict(self._json(response)).expires_at
        return True

    async def renew(self, lease_id: str, ttl_s: float) -> Lease | None:
        response = await self._call("POST", f"/api/v1/leases/{lease_id}/renew",
                                    {"ttl_s": ttl_s})
        if self._gone(response):
            return None
        return Lease.from_dict(self._json(response))

    async def release(self, lease_id: str) -> bool:
        response = await self._call("DELETE", f"/api/v1/leases/{lease_id}")
        if self._gone(response):
            return False
        return bool(self._json(response).get("released"))

    async def list(self) -> list[Lease]:
        body = self._json(await self._call("GET", "/api/v1/leases"))
        return [Lease.from_dict(item) for item in body["leases"]]

    async def publish_inventory(self, gpus: list[dict]) -> None:
        return None  # the daemon owns the inventory

    async def inventory(self) -> list[dict]:
        return self._json(await self._call("GET", "/api/v1/gpus"))["gpus"]

    async def close(self) -> None:
        await self._client.aclose()
