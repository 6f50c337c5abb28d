"""The key API (admin): create, list, change, rotate and revoke keys without a restart. A
secret is answered once, by ``create`` and ``rotate``; only its hash is kept."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ...errors import BadRequest
from ...settings import ClientProfile, EndpointKind, EndUserLimits
from ...tenancy.keys import KeyNotFound, KeyRecord, KeyStore
from ..errors import OpenAIError, documented

router = APIRouter(tags=["keys"], responses=documented(OpenAIError))

KeyName = Annotated[str, Path(min_length=1, max_length=64)]


class KeyChange(BaseModel):
    """What ``PATCH /api/v1/keys/{name}`` may change (a field sent as null is cleared):
    ``models`` (names or globs), ``endpoints`` (chat, embeddings, images, video, audio,
    rerank, realtime), ``admin``, ``expires_at`` (ISO 8601), and every limit of a client
    profile, with ``end_user_limits`` (each end user's under the key)."""

    model_config = ConfigDict(extra="forbid")

    models: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = None
    admin: bool | None = None
    expires_at: datetime | None = None
    endpoints: list[EndpointKind] | None = None
    default_task: str | None = Field(default=None, min_length=1, max_length=200)
    priority_floor: int | None = Field(default=None, ge=0, le=100)
    priority: int | None = Field(default=None, ge=0, le=100)
    max_concurrency: int | None = Field(default=None, ge=1)
    max_queued: int | None = Field(default=None, ge=0)
    share: float | None = Field(default=None, gt=0)
    requests_per_minute: int | None = Field(default=None, ge=0)
    tokens_per_minute: int | None = Field(default=None, ge=0)
    tokens_per_day: int | None = Field(default=None, ge=0)
    tokens_per_month: int | None = Field(default=None, ge=0)
    images_per_day: int | None = Field(default=None, ge=0)
    audio_seconds_per_day: float | None = Field(default=None, ge=0)
    gpu_seconds_per_day: float | None = Field(default=None, ge=0)
    gpu_seconds_per_month: float | None = Field(default=None, ge=0)
    end_user_limits: EndUserLimits | None = None  # replaced whole when sent


class KeyCreate(KeyChange):
    """``POST /api/v1/keys``: a name and, optionally, everything a change may say."""

    name: str = Field(min_length=1, max_length=64)


def _store(request: Request) -> KeyStore:
    return request.app.state.coordinator.keys


def _profile(base: ClientProfile, change: KeyChange, given: set[str]) -> ClientProfile:
    fields = base.model_dump()
    for name in given & set(ClientProfile.model_fields):
        fields[name] = getattr(change, name)
    if "models" in given:
        fields["allowed_models"] = change.models
    return ClientProfile.model_validate(fields)


def _when(at: datetime | None) -> float | None:
    if at is None:
        return None
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def _shown(record: KeyRecord, secret: str | None = None) -> dict[str, Any]:
    shown = record.public()
    return {"name": record.name, "key": secret, **shown} if secret else shown


@router.post("/api/v1/keys", status_code=201)
async def create_key(request: Request, body: KeyCreate) -> JSONResponse:
    given = body.model_fields_set
    expires = _when(body.expires_at)
    if expires is not None and expires <= datetime.now(UTC).timestamp():
        raise BadRequest("expires_at: must be in the future", param="expires_at",
                         code="invalid_value")
    record, secret = await _store(request).create(
        body.name, _profile(ClientProfile(), body, given), admin=bool(body.admin),
        expires_at=expires)
    return JSONResponse(_shown(record, secret), status_code=201)


@router.get("/api/v1/keys")
async def list_keys(request: Request) -> dict[str, Any]:
    return {"keys": [record.public() for record in _store(request)]}


@router.get("/api/v1/keys/{name}")
async def get_key(request: Request, name: KeyName) -> dict[str, Any]:
    store = _store(request)
    record = store.get(name)
    if record is None:
        raise KeyNotFound(f"no key named '{name}'", param="name")
    return record.public()


@router.patch("/api/v1/keys/{name}")
async def change_key(request: Request, name: KeyName, body: KeyChange) -> dict[str, Any]:
    store = _store(request)
    current = store.get(name)
    given = body.model_fields_set
    changes: dict[str, Any] = {}
    if current is not None:
        changes["profile"] = _profile(current.profile, body, given)
    if "admin" in given:
        changes["admin"] = bool(body.admin)
    if "expires_at" in given:
        changes["expires_at"] = _when(body.expires_at)
    return (await store.update(name, **changes)).public()


@router.post("/api/v1/keys/{name}/rotate")
async def rotate_key(request: Request, name: KeyName) -> dict[str, Any]:
    record, secret = await _store(request).rotate(name)
    return _shown(record, secret)


@router.delete("/api/v1/keys/{name}")
async def revoke_key(request: Request, name: KeyName) -> dict[str, Any]:
    return (await _store(request).revoke(name)).public()
