"""The HTTP lease API: outside jobs (training runs, notebooks) take VRAM through GPUBoss."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, model_validator

from ..errors import LeaseNotFound, LeaseUnavailable
from ..gpu import GPUBoss, Lease
from ..tenancy.keys import identity_of
from .errors import OpenAIError, documented

router = APIRouter(responses=documented(OpenAIError))


class LeaseTerms(BaseModel):
    """What a lease body may say besides where its VRAM is."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(default="external", min_length=1, max_length=64)
    holder: str | None = Field(default=None, max_length=200)
    priority: int = Field(default=5, ge=0, le=100)
    ttl_s: float | None = Field(default=None, gt=0, le=3600)
    note: str = Field(default="", max_length=500)


class LeaseRequest(LeaseTerms):
    """``POST /api/v1/leases``: ``vram_mb`` (optionally on ``gpu``) or ``allocations``."""

    vram_mb: int | None = Field(default=None, gt=0)
    gpu: NonNegativeInt | None = None
    allocations: dict[NonNegativeInt, PositiveInt] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_shape(self) -> LeaseRequest:
        if self.allocations is not None and (self.vram_mb is not None or self.gpu is not None):
            raise ValueError("give allocations, or vram_mb with an optional gpu, not both")
        return self


class RenewRequest(BaseModel):
    """``POST /api/v1/leases/{id}/renew``: a new TTL, else the boss's default."""

    model_config = ConfigDict(extra="forbid")

    ttl_s: float | None = Field(default=None, gt=0, le=3600)


class ReassertRequest(LeaseTerms):
    """``PUT /api/v1/leases/{id}``: the lease as its holder knows it."""

    allocations: dict[NonNegativeInt, PositiveInt] = Field(min_length=1)


LeaseId = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$", max_length=100)]


def boss_of(request: Request) -> GPUBoss:
    return request.app.state.boss


def address_of(request: Request) -> str:
    return request.client.host if request.client else "?"


def holder_of(request: Request, body: LeaseTerms) -> str:
    """The name the lease was taken with: the body's ``holder``, else the client the request
    names (its key's name, else its ``X-Client-Id``), else the caller's address."""
    who = identity_of(request.scope)
    client = (who.client or "").strip()[:200] if who is not None else ""
    return body.holder or client or f"http:{address_of(request)}"


@router.get("/api/v1/leases")
async def list_leases(request: Request) -> dict[str, Any]:
    boss = boss_of(request)
    return {"leases": [lease.to_dict() for lease in await boss.leases()],
            "gpus": [usage.to_dict() for usage in await boss.usage()]}


@router.post("/api/v1/leases", status_code=201)
async def acquire_lease(request: Request, body: LeaseRequest) -> JSONResponse:
    """Granted leases are renewed by their holder (``/renew``), not by the daemon."""
    boss = boss_of(request)
    lease = await boss.acquire(
        kind=body.kind, allocations=body.allocations, vram_mb=body.vram_mb, gpu=body.gpu,
        priority=body.priority, ttl_s=body.ttl_s,
        holder=holder_of(request, body), note=body.note, address=address_of(request),
        heartbeat=False)
    return JSONResponse(lease.to_dict(), status_code=201)


@router.put("/api/v1/leases/{lease_id}")
async def reassert_lease(request: Request, lease_id: LeaseId,
                         body: ReassertRequest) -> dict[str, Any]:
    """Put back, under its own id, a lease the store lost (a Redis restart), if it still fits.

    A holder's heartbeat calls this when ``/renew`` answers 404; 503 ``lease_unavailable``
    means the VRAM was taken meanwhile and the holder must treat the lease as lost.
    """
    boss = boss_of(request)
    lease = Lease(id=lease_id, holder=holder_of(request, body), kind=body.kind,
                  allocations=dict(body.allocations), priority=body.priority,
                  ttl_s=body.ttl_s or boss.ttl_s, note=body.note,
                  address=address_of(request))
    if not await boss.reassert(lease):
        raise LeaseUnavailable(f"lease {lease_id} no longer fits: its VRAM was taken",
                               retry_after_s=5)
    return lease.to_dict()


@router.post("/api/v1/leases/{lease_id}/renew")
async def renew_lease(request: Request, lease_id: str,
                      body: RenewRequest | None = None) -> dict[str, Any]:
    lease = await boss_of(request).renew(lease_id, body.ttl_s if body else None)
    return lease.to_dict()


@router.delete("/api/v1/leases/{lease_id}")
async def release_lease(request: Request, lease_id: str) -> dict[str, Any]:
    if not await boss_of(request).release(lease_id):
        raise LeaseNotFound(f"lease {lease_id} does not exist or has expired")
    return {"id": lease_id, "released": True}


@router.get("/api/v1/gpus")
async def gpus(request: Request) -> dict[str, Any]:
    boss = boss_of(request)
    usage = {u.index: u for u in await boss.usage()}
    return {"gpus": [{**g.to_dict(), **(usage[g.index].to_dict() if g.index in usage else {})}
                     for g in boss.gpus]}
