"""API keys: which key a request must carry on a path, and which client a named key is.

``api_key`` is one shared user key; ``api_keys`` names a key per client, so the key itself
says who is asking (fair share, queue limits and the client's profile) when the request
does not name its client with ``x_client_id`` / ``X-Client-Id``. ``admin_api_key`` guards
``/api/*`` when set; without it those routes take the user keys, as before named keys.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from starlette.datastructures import Headers

from ...settings import Settings

CLIENT_HEADER = b"x-client-id"


@dataclass(frozen=True, slots=True)
class KeyCheck:
    """The outcome for one request: allowed or not, and the client its key names."""

    allowed: bool
    client: str | None = None


def given_key(headers: Headers) -> str:
    """The key a request carries: ``Authorization: Bearer KEY``, else ``X-API-Key``."""
    header = headers.get("authorization", "")
    return header[7:] if header.lower().startswith("bearer ") else headers.get("x-api-key", "")


def check_key(given: str, settings: Settings, *, admin: bool) -> KeyCheck:
    """Whether ``given`` opens a path (``admin``: an ``/api/*`` route), comparing in constant
    time against every configured key so the answer's timing says nothing about which."""
    if admin and settings.admin_api_key:
        return KeyCheck(_same(given, settings.admin_api_key))
    if not settings.user_keys_set:
        return KeyCheck(True)
    allowed, client = bool(settings.api_key) and _same(given, settings.api_key), None
    for name, secret in settings.api_keys.items():
        if _same(given, secret.get_secret_value()):
            allowed, client = True, name
    return KeyCheck(allowed, client)


def with_client(scope_headers: list[tuple[bytes, bytes]], client: str,
                ) -> list[tuple[bytes, bytes]]:
    """The request's headers with ``X-Client-Id: client`` added unless it names one itself
    (an explicit client id, in the header or the body's ``x_client_id``, wins)."""
    if any(name.lower() == CLIENT_HEADER for name, _ in scope_headers):
        return scope_headers
    return [*scope_headers, (CLIENT_HEADER, client.encode())]


def _same(given: str, wanted: str) -> bool:
    return hmac.compare_digest(given.encode(), wanted.encode())
