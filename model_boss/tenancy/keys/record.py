"""KeyRecord: one key as the box knows it: its name, the hash of its secret, its scope and
limits (a :class:`~model_boss.settings.ClientProfile`), whether it is an admin's, and when it
expires or was revoked. The secret itself is never kept."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ...settings import ClientProfile

SECRET_PREFIX = "mb-"  # a managed key's secret starts so (a config file's keys are as given)
# where a key came from: the config file's api_keys / api_key / admin_api_key, or the API
MANAGED, CONFIG = "managed", "config"


def hash_secret(secret: str) -> str:
    """The SHA-256 of a secret, hex: what is stored and looked up."""
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> str:
    """A fresh secret: 32 random bytes, URL-safe, with the prefix."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def same_secret(given: str, wanted: str) -> bool:
    """Compare two secrets in constant time."""
    return hmac.compare_digest(given.encode(), wanted.encode())


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One key. ``prefix`` is the start of its secret (shown in lists to tell keys apart)."""

    name: str
    secret_hash: str
    profile: ClientProfile = field(default_factory=ClientProfile)
    admin: bool = False
    source: str = MANAGED
    prefix: str = ""
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    expires_at: float | None = None
    revoked_at: float | None = None

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (now or time.time()) >= self.expires_at

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def changed(self, **changes: Any) -> KeyRecord:
        return replace(self, updated_at=time.time(), **changes)

    def public(self) -> dict[str, Any]:
        """The record as the API lists it: no secret, no hash."""
        return {"name": self.name, "prefix": self.prefix, "admin": self.admin,
                "source": self.source, "created_at": _iso(self.created_at),
                "updated_at": _iso(self.updated_at), "expires_at": _iso(self.expires_at),
                "revoked_at": _iso(self.revoked_at),
                "models": self.profile.allowed_models,
                **self.profile.model_dump(exclude={"allowed_models"}, exclude_none=True)}


def _iso(at: float | None) -> str | None:
    if at is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
