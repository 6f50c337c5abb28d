"""RuntimeConfig: toggles changed while running, persisted in Redis or in state_dir."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from .errors import BadRequest, StoreUnavailable

log = logging.getLogger(__name__)

REDIS_KEY = "model-boss:runtime-config"


class RuntimeValues(BaseModel):
    """camelCase on the wire: ``{"allowCloudFallback": true}``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    allow_cloud_fallback: StrictBool = Field(default=True, alias="allowCloudFallback")

    def wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)


class RuntimeConfig:
    """Current values; ``update`` validates a partial body and persists the result."""

    def __init__(self, seed: RuntimeValues, *, state_file: Path | None = None,
                 redis_url: str = "") -> None:
        self.values = seed
        self.state_file = state_file
        self.redis_url = redis_url
        self._lock = asyncio.Lock()

    @property
    def allow_cloud_fallback(self) -> bool:
        return self.values.allow_cloud_fallback

    async def _read(self) -> dict[str, Any] | None:
        if self.redis_url:
            import redis.asyncio as redis

            client = redis.from_url(self.redis_url)
            try:
                raw = await client.get(REDIS_KEY)
            except redis.RedisError as exc:
                raise StoreUnavailable(f"runtime config: Redis unreachable: {exc}") from exc
            finally:
                await client.aclose()
            return json.loads(raw) if raw else None
        if self.state_file and self.state_file.exists():
            return json.loads(self.state_file.read_text())
        return None

    async def _write(self) -> None:
        data = json.dumps(self.values.wire())
        if self.redis_url:
            import redis.asyncio as redis

            client = redis.from_url(self.redis_url)
            try:
                await client.set(REDIS_KEY, data)
            except redis.RedisError as exc:
                raise StoreUnavailable(f"runtime config: Redis unreachable: {exc}") from exc
            finally:
                await client.aclose()
        elif self.state_file:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_file.with_suffix(".tmp")
            tmp.write_text(data)
            tmp.replace(self.state_file)

    async def restore(self) -> None:
        """Take persisted values over the seed (the seed only fills what was never saved)."""
        try:
            stored = await self._read()
        except (OSError, ValueError, StoreUnavailable) as exc:
            log.warning("could not read persisted runtime config: %s", exc)
            return
        if stored:
            merged = {**self.values.wire(), **stored}
            try:
                self.values = RuntimeValues.model_validate(merged)
            except ValidationError as exc:
                log.warning("ignoring invalid persisted runtime config: %s", exc)

    async def update(self, patch: Any) -> dict[str, Any]:
        if not isinstance(patch, dict):
            raise BadRequest("config update must be a JSON object")
        async with self._lock:
            try:
                updated = RuntimeValues.model_validate({**self.values.wire(), **patch})
            except ValidationError as exc:
                err = exc.errors()[0]
                field = ".".join(str(p) for p in err["loc"]) or None
                raise BadRequest(f"{field}: {err['msg']}", param=field) from exc
            self.values = updated
            await self._write()
        return self.values.wire()
