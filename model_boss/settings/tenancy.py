"""Keys and limits: the config keys, the client profiles, and the limits a profile may set,
declared once."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from ..endpoints import KINDS

# what a key may be scoped to, by the routes' kind (docs/SECURITY.md)
EndpointKind = Literal[KINDS]  # type: ignore[valid-type]
ENDPOINT_KINDS: tuple[str, ...] = KINDS

Count = Annotated[int, Field(ge=0)]
Seconds = Annotated[float, Field(ge=0)]
# The limits a client or key profile may set, each with its type, declared once: the key API,
# the keys command line, the door's admission, the cluster's counters and the policy read
# these. Rates count a sliding minute; quotas a UTC day or month.
RATES: dict[str, type] = {"requests_per_minute": int, "tokens_per_minute": int}
QUOTAS: dict[str, type] = {
    "tokens_per_day": int, "tokens_per_month": int, "images_per_day": int,
    "audio_seconds_per_day": float, "gpu_seconds_per_day": float,
    "gpu_seconds_per_month": float}
LIMITS: dict[str, type] = {"priority_floor": int, "priority": int, "max_concurrency": int,
                           "max_queued": int, "share": float, **RATES, **QUOTAS}
# The limits a key's profile may set on each end user under it (``end_user_limits``): the
# same names and meanings as the key's own, counted per end user label.
# The rates and quota of them are checked before the queue; the rest by the queue.
END_USER_RATES: dict[str, type] = {**RATES, "tokens_per_day": int}
END_USER_LIMITS: dict[str, type] = {"max_concurrency": int, "max_queued": int,
                                    **END_USER_RATES}


class EndUserLimits(BaseModel):
    """What each end user under a key (its ``X-Client-Id``, ``user`` or
    ``metadata.user_id``) may do, whoever it is: requests running and waiting at once, a
    sliding minute's requests and tokens, and a UTC day's tokens. Beyond: 429 with
    ``Retry-After``, while the key's other end users are served (docs/SECURITY.md)."""

    model_config = ConfigDict(extra="forbid")

    max_concurrency: int | None = Field(default=None, ge=1)
    max_queued: int | None = Field(default=None, ge=0)
    requests_per_minute: Count | None = None
    tokens_per_minute: Count | None = None
    tokens_per_day: Count | None = None

    @property
    def rated(self) -> bool:
        """Whether it sets a rate or a quota (checked before the queue)."""
        return any(getattr(self, name) is not None for name in END_USER_RATES)


class ClientProfile(BaseModel):
    """Defaults, scope and limits for one client: a key's name (``api_keys``, a managed key)
    or, with no keys configured, a client id (``x_client_id`` / ``X-Client-Id``).

    ``allowed_models`` are names or globs (``qwen*``); ``endpoints`` the kinds of route it
    may call; ``priority_floor`` the most important priority it may ask for. Rates count a
    sliding minute; quotas a UTC day or month; ``end_user_limits`` bound each end user
    under a key (docs/SECURITY.md)."""

    model_config = ConfigDict(extra="forbid")

    priority: int | None = Field(default=None, ge=0, le=100)
    max_concurrency: int | None = Field(default=None, ge=1)
    max_queued: int | None = Field(default=None, ge=0)  # waiting at once; beyond: 429
    share: float | None = Field(default=None, gt=0)  # fair-share weight (else the task's)
    default_task: str | None = None
    allowed_models: list[Annotated[str, Field(min_length=1)]] | None = None
    endpoints: list[EndpointKind] | None = None
    priority_floor: int | None = Field(default=None, ge=0, le=100)
    requests_per_minute: Count | None = None
    tokens_per_minute: Count | None = None
    tokens_per_day: Count | None = None
    tokens_per_month: Count | None = None
    images_per_day: Count | None = None
    audio_seconds_per_day: Seconds | None = None
    gpu_seconds_per_day: Seconds | None = None
    gpu_seconds_per_month: Seconds | None = None
    end_user_limits: EndUserLimits | None = None  # each end user's under a key


class TenancySettings(BaseModel):
    """The keys set in the config and the profiles of the clients they name."""

    api_key: str | None = None
    # named user keys: client name → key; a request with one is that client (docs/CONFIGURATION.md)
    api_keys: dict[Annotated[str, Field(min_length=1, max_length=200)],
                   Annotated[SecretStr, Field(min_length=1)]] = Field(default_factory=dict)
    admin_api_key: str | None = None
    # the bearer a Prometheus scrape sends for /metrics (an admin's key opens it too); unset:
    # /metrics is open
    metrics_api_key: Annotated[SecretStr, Field(min_length=1)] | None = None
    clients: dict[str, ClientProfile] = Field(default_factory=dict)

    @field_validator("api_keys")
    @classmethod
    def _client_names_travel_as_headers(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for client in value:
            if not all("!" <= ch <= "~" for ch in client):
                raise ValueError(f"client name {client!r}: visible ASCII only, no spaces (it "
                                 "is the request's X-Client-Id)")
        return value

    @model_validator(mode="after")
    def _keys_are_distinct(self) -> Self:
        seen: dict[str, str] = {}
        if self.api_key:
            seen[self.api_key] = "api_key"
        if self.admin_api_key:
            seen[self.admin_api_key] = "admin_api_key"
        for client, secret in self.api_keys.items():
            key = secret.get_secret_value()
            if key in seen:
                raise ValueError(f"api_keys.{client}: the same key as {seen[key]}; "
                                 "each client needs its own")
            seen[key] = f"api_keys.{client}"
        return self

    @property
    def user_keys_set(self) -> bool:
        """Whether ``/v1/*`` needs a key (``api_key`` or any of ``api_keys``)."""
        return bool(self.api_key or self.api_keys)
