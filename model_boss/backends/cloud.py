"""CloudBackend: a remote speaking OpenAI's API, or Anthropic's (``api: anthropic``). No VRAM.

The data path is the shared :class:`~model_boss.backends.upstream.UpstreamClient` (one pooled
keep-alive aiohttp session per backend; see that module for why not httpx) and the same
:func:`~model_boss.backends.base.forward` the local workers use, so error mapping and
chunk-by-chunk streaming are one piece of code.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import orjson

from ..catalog import CatalogEntry
from ..errors import BadRequest, ModelBossError, UpstreamError
from ..gpu.placement import Placement
from ..settings import Settings
from .base import UpstreamResponse, forward
from .upstream import UpstreamClient

log = logging.getLogger(__name__)

# Connections to one remote: sized for many concurrent requests, not for a local worker.
MAX_CONNECTIONS = 256
ANTHROPIC_VERSION = "2023-06-01"  # the Messages API's version header, for ``api: anthropic``


class CloudBackend:
    """A remote (OpenAI's API, or Anthropic's with ``api: anthropic``) reached at the
    manifest's ``base_url``, with the key named by ``api_key_env``.

    Nothing is spawned (``pid`` is None, ``on_exit`` never fires); ``start`` opens one pooled
    client, each request's body is serialised once with ``model`` set to ``remote_model``,
    and streams are relayed chunk by chunk as they arrive.
    """

    needs_vram = False
    can_offload = False
    alive = True  # a remote: reachability shows per request

    def __init__(self, entry: CatalogEntry, settings: Settings) -> None:
        self.entry = entry
        self.manifest = entry.manifest
        self.settings = settings
        self.on_exit: Callable[[int], None] | None = None
        self.pid: int | None = None
        self.port: int | None = None  # a remote listens on no local port
        self._client: UpstreamClient | None = None
        self._headers: dict[str, str] = {"content-type": "application/json"}
        self._remote_model = self.manifest.remote_model or self.manifest.id
        self.speaks_anthropic = self.manifest.api == "anthropic"

    async def start(self, port: int, placement: Placement | None) -> None:
        """Read the key from the environment and open the pooled client; ``port`` and
        ``placement`` do not apply to a remote."""
        m = self.manifest
        self._headers = {"content-type": "application/json"}
        if self.speaks_anthropic:
            self._headers["anthropic-version"] = ANTHROPIC_VERSION
        if m.api_key_env:
            key = os.environ.get(m.api_key_env)
            if key and self.speaks_anthropic:
                self._headers["x-api-key"] = key
            elif key:
                self._headers["authorization"] = f"Bearer {key}"
            else:
                log.warning("%s: api_key_env %s is not set; calling %s without a key",
                            m.id, m.api_key_env, m.base_url)
        self._client = UpstreamClient(m.base_url or "", timeout_s=self.settings.request_timeout_s,
                                      max_connections=MAX_CONNECTIONS)

    async def retire(self) -> None:
        """A remote keeps nothing of ours."""

    async def stop(self) -> None:
        """Close the pooled client (and its keep-alive connections)."""
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def health_check(self) -> bool:
        """Started means ready: a remote's own health is learned from its answers."""
        return self._client is not None

    async def _unreachable(self, exc: Exception) -> UpstreamError:
        return UpstreamError(f"'{self.manifest.id}': {self.manifest.base_url} unreachable: "
                             f"{exc}", code="upstream_unreachable")

    async def handle_request(self, endpoint: str, body: dict[str, Any],
                             stream: bool) -> UpstreamResponse:
        """POST ``body`` to ``base_url`` + the endpoint without its ``/v1`` prefix
        (``/v1/chat/completions`` → ``{base_url}/chat/completions``)."""
        if self._client is None:
            raise ModelBossError(f"'{self.manifest.id}' is not started", status_code=503,
                                 code="model_load_failed")
        if self.speaks_anthropic and not endpoint.startswith("/v1/messages"):
            raise BadRequest(f"'{self.manifest.id}' speaks Anthropic's Messages API only: "
                             "send it to /v1/messages", param="model",
                             code="unsupported_endpoint")
        body["model"] = self._remote_model  # the caller hands us its own copy
        path = endpoint[3:] if endpoint.startswith("/v1/") else endpoint
        return await forward(self._client, path, orjson.dumps(body), self._headers, stream,
                             self.manifest.id, self._unreachable, our_secret=False)

    async def offload(self) -> dict[str, Any]:
        """Nothing to offload: a remote holds no VRAM here."""
        return {}

    async def onload(self) -> dict[str, Any]:
        """Nothing to bring back."""
        return {}

    async def report(self) -> dict[str, Any]:
        """No measured VRAM or worker state to report."""
        return {}

    async def kv_cache_usage(self) -> float | None:
        """A remote's cache is not seen from here."""
        return None
