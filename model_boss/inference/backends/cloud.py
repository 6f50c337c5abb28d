"""CloudBackend: an OpenAI-compatible remote (how ``claude:*`` ids are served). No VRAM."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import orjson

from ...catalog import CatalogEntry
from ...errors import ModelBossError, UpstreamError
from ...gpu.placement import Placement
from ...settings import Settings
from ..backend import UpstreamResponse, forward
from ..upstream import UpstreamClient

log = logging.getLogger(__name__)


class CloudBackend:
    """One pooled keep-alive client to ``base_url``; bodies serialised once, streams relayed
    chunk by chunk as they arrive."""

    needs_vram = False
    can_offload = False

    def __init__(self, entry: CatalogEntry, settings: Settings) -> None:
        self.entry = entry
        self.manifest = entry.manifest
        self.settings = settings
        self.on_exit: Callable[[int], None] | None = None
        self.pid = None
        self._client: UpstreamClient | None = None
        self._headers = {"content-type": "application/json"}

    async def start(self, port: int, placement: Placement | None) -> None:
        m = self.manifest
        if m.api_key_env:
            key = os.environ.get(m.api_key_env)
            if key:
                self._headers["authorization"] = f"Bearer {key}"
            else:
                log.warning("%s: api_key_env %s is not set; calling %s without a key",
                            m.id, m.api_key_env, m.base_url)
        self._client = UpstreamClient(m.base_url or "",
                                      timeout_s=self.settings.request_timeout_s)

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def health_check(self) -> bool:
        return self._client is not None

    async def _unreachable(self, exc: Exception) -> UpstreamError:
        return UpstreamError(f"'{self.manifest.id}': {self.manifest.base_url} unreachable: "
                             f"{type(exc).__name__}: {exc}", code="upstream_unreachable")

    async def handle_request(self, endpoint: str, body: dict[str, Any],
                             stream: bool) -> UpstreamResponse:
        if self._client is None:
            raise ModelBossError(f"'{self.manifest.id}' is not started", status_code=503,
                                 code="model_load_failed")
        body["model"] = self.manifest.remote_model or self.manifest.id
        path = endpoint[3:] if endpoint.startswith("/v1/") else endpoint
        return await forward(self._client, path, orjson.dumps(body), self._headers, stream,
                             self.manifest.id, self._unreachable)

    async def offload(self) -> dict[str, Any]:
        return {}

    async def onload(self) -> dict[str, Any]:
        return {}

    async def report(self) -> dict[str, Any]:
        return {}
