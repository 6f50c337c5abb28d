"""Identify: the edge decides who a request is, once, and leaves it on the request
(:func:`~model_boss.tenancy.keys.with_identity`; read back with
:func:`~model_boss.tenancy.keys.identity_of`). With keys configured, a route that needs one is
refused without a good key (admin routes need an admin's); the key, with the client id the
request named as its end user, is the identity. A cluster member's forward (trusted by
:mod:`.forwards`) carries its key in its body and is identified where that is read."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from ...cluster import FORWARDED_HEADER
from ...coordinator import Coordinator
from ...errors import BadRequest, Unauthorized
from ...tenancy.keys import Identity, with_identity
from ..errors import error_response
from ..ollama import ADMIN_PATHS, is_ollama_path
from .keys import check_key, given_key, identity

OPEN_PATHS = {"/health", "/metrics"}
# under /api/, yet any key may use them, on its own: its usage, its jobs
USER_API_PATHS = {"/api/v1/usage"}
USER_API_PREFIXES = ("/api/v1/jobs",)
# The dashboard's static files: no state, no secret; the page asks for a key when the API does.
OPEN_PREFIXES = ("/ui/",)


class Identify:
    def __init__(self, app: ASGIApp, coordinator: Coordinator) -> None:
        self.app = app
        self.coord = coordinator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        keys = self.coord.keys
        path = scope["path"]
        if FORWARDED_HEADER in headers or not keys.enforced or _open(path):
            who = Identity(end_user=headers.get("x-client-id"))
        else:
            # a key's own usage and jobs: with no user key, only an admin reads them
            checked = check_key(given_key(headers), keys, admin=_admin_path(path) or (
                not keys.users_enforced and _user_api_path(path)))
            if not checked.allowed:
                await error_response(checked.error or Unauthorized(
                    "missing or invalid API key"))(scope, receive, send)
                return
            who = identity(checked, headers)
            if who.keyed and who.end_user == "":
                await error_response(BadRequest(
                    "X-Client-Id: must not be empty (leave the header out)",
                    param="x_client_id", code="invalid_value"))(scope, receive, send)
                return
        await self.app(with_identity(scope, who), receive, send)


def _admin_path(path: str) -> bool:
    """The admin API: ``/api/*`` but Ollama's data routes, and a key's own usage and jobs."""
    return path.startswith("/api/") and not _user_api_path(path) and (
        not is_ollama_path(path) or path in ADMIN_PATHS)


def _user_api_path(path: str) -> bool:
    return path in USER_API_PATHS or path.startswith(USER_API_PREFIXES)


def _open(path: str) -> bool:
    """Paths that need no key: health, metrics and the dashboard's page and files."""
    return path in OPEN_PATHS or path == "/ui" or path.startswith(OPEN_PREFIXES)
