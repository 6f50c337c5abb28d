"""Who a request is, from its key alone, and whether that key may make it.

With keys configured (``api_keys``, ``api_key``, ``admin_api_key`` or any managed key), a
request's identity is the key it carries: its ``X-Client-Id`` (like the body's
``x_client_id``, ``user`` or ``metadata.user_id``) becomes an *end user* label under the key
and never widens what the key may do; every per-client limit downstream (the queue gate, fair
share, ``max_concurrency``) counts the key (:attr:`Identity.client`). The pure checks are
here; the middleware that applies them are :mod:`.identity` and :mod:`.admission`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from starlette.datastructures import Headers

from ...endpoints import JOBS, endpoint_kind
from ...errors import Forbidden, ModelBossError, Unauthorized
from ...settings import QUOTAS, RATES
from ...tenancy.keys import (
    Identity,
    KeyRecord,
    KeyStore,
    MinuteWindows,
    end_user_label,
    kind_in_scope,
    refusal,
)
from ...tenancy.usage import Spent, day_start, month_start

CLIENT_HEADER = "x-client-id"
# what a browser offers, having no Authorization header for a WebSocket: "realtime" and this
# prefix before the key (the server answers "realtime", never the key)
KEY_SUBPROTOCOL = "openai-insecure-api-key."
JOBS_PATH = JOBS


@dataclass(frozen=True, slots=True)
class KeyCheck:
    """The outcome for one request: allowed or not, and the key it came with."""

    allowed: bool
    record: KeyRecord | None = None
    error: ModelBossError | None = None

    @property
    def client(self) -> str | None:
        return self.record.name if self.record is not None else None


def given_key(headers: Headers) -> str:
    """The key a request carries: ``Authorization: Bearer KEY``, else ``X-API-Key``, else
    (a browser's WebSocket, which cannot set a header) the subprotocol
    ``openai-insecure-api-key.KEY`` it offers, as OpenAI's browser clients send it."""
    header = headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:]
    return headers.get("x-api-key") or subprotocol_key(headers)


def subprotocol_key(headers: Headers) -> str:
    """The key among a WebSocket handshake's offered subprotocols; "" when none is."""
    for offered in headers.get("sec-websocket-protocol", "").split(","):
        offered = offered.strip()
        if offered.startswith(KEY_SUBPROTOCOL):
            return offered[len(KEY_SUBPROTOCOL):]
    return ""


def check_key(given: str, keys: KeyStore, *, admin: bool, now: float | None = None) -> KeyCheck:
    """Whether ``given`` opens a path (``admin``: an admin route). Keys are looked up by the
    SHA-256 of what is given, so the answer's timing says nothing about any secret."""
    if not keys.enforced:
        return KeyCheck(True)
    record = keys.lookup(given)
    if not admin and not keys.users_enforced and (record is None or record.revoked):
        return KeyCheck(True)  # only the admin routes are guarded (``admin_api_key`` alone)
    if record is None or record.revoked:
        return KeyCheck(False, error=Unauthorized("missing or invalid API key"))
    if record.expired(now):
        return KeyCheck(False, error=Unauthorized(f"the key '{record.name}' has expired",
                                                  code="key_expired"))
    if admin and not record.admin:
        return KeyCheck(False, error=Unauthorized("missing or invalid API key"))
    return KeyCheck(True, record)


def identity(checked: KeyCheck, headers: Headers) -> Identity:
    """Who a request is once its key was checked: the key (where one decided) with the client
    id the request named as its end user label, else that client id alone."""
    named = headers.get(CLIENT_HEADER)
    record = checked.record
    if record is None:
        return Identity(end_user=named)
    return Identity(record.name, record.admin, record,
                    end_user_label(named) if named is not None else None)


class SpentReader(Protocol):
    """What a key spent since a time (the usage ledger's ``spent``)."""

    def __call__(self, key: str, since: float) -> Spent: ...


class KeyAdmission:
    """A key's rates and quotas at the door of an inference route: the scope of its kind of
    route, then :func:`~model_boss.tenancy.keys.refusal` over its last minute and what it spent
    today and this month (the usage ledger's running totals)."""

    def __init__(self, windows: MinuteWindows, spent: SpentReader) -> None:
        self.windows = windows
        self.spent = spent

    def admit(self, record: KeyRecord, path: str, now: float | None = None,
              ) -> ModelBossError | None:
        now = time.time() if now is None else now
        profile = record.profile
        kind = endpoint_kind(path)
        if path != JOBS_PATH and not kind_in_scope(profile, kind):  # a job's: when taken
            return Forbidden(f"the key '{record.name}' may not call {kind} routes (it may "
                             f"call: {', '.join(profile.endpoints or []) or 'none'})",
                             code="endpoint_not_allowed")
        if _limited(profile):
            minute = self.windows.reading(record.name, now)
            day, month = (self.spent(record.name, day_start(now)),
                          self.spent(record.name, month_start(now)))
            refused = refusal(record.name, profile, now=now, minute=minute, day=day,
                              month=month)
            if refused is not None:
                return refused
        self.windows.admitted(record.name, now)
        return None


def _limited(profile: object) -> bool:
    return any(getattr(profile, name) is not None for name in (*RATES, *QUOTAS))


__all__ = ["KEY_SUBPROTOCOL", "KeyAdmission", "KeyCheck", "SpentReader", "check_key",
           "given_key", "identity", "subprotocol_key"]
