"""RuntimeConfig: toggles changed while running, persisted in Redis or in state_dir."""

from __future__ import annotations

import asyncio
import contextlib
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
    """Current values; ``update`` validates a partial body, persists it, then applies it.

    With Redis, :meth:`restore` also starts a keeper that, every ``keep_interval_s``, writes
    the values back if the key is gone (a Redis restart without persistence): the values in
    effect here stay what they were and other readers see them again.
    """

    def __init__(self, seed: RuntimeValues, *, state_file: Path | None = None,
                 redis_url: str = "", keep_interval_s: float = 5.0) -> None:
        self.values = seed
        self.state_file = state_file
        self.redis_url = redis_url
        self.keep_interval_s = keep_interval_s
        self._lock = asyncio.Lock()
        self._restored = False
        self._keeper: asyncio.Task | None = None
        self._closing = asyncio.Event()

    @property
    def allow_cloud_fallback(self) -> bool:
        return self.values.allow_cloud_fallback

    async def _redis(self, command: str, *args: Any, **options: Any) -> Any:
        import redis.asyncio as redis

        client = redis.from_url(self.redis_url, socket_connect_timeout=5, socket_timeout=5)
        try:
            return await client.execute_command(command, *args, **options)
        except redis.RedisError as exc:
            raise StoreUnavailable(f"runtime config: Redis unreachable: {exc}",
                                   retry_after_s=5) from exc
        finally:
            await client.aclose()

    async def _read(self) -> dict[str, Any] | None:
        if self.redis_url:
            raw = await self._redis("GET", REDIS_KEY)
            return json.loads(raw) if raw else None
        if self.state_file and self.state_file.exists():
            return json.loads(self.state_file.read_text())
        return None

    async def _write(self, values: RuntimeValues, *, only_if_missing: bool = False) -> bool:
        """Persist ``values``; False when ``only_if_missing`` and Redis already has the key."""
        data = json.dumps(values.wire())
        if self.redis_url:
            extra = ("NX",) if only_if_missing else ()
            return bool(await self._redis("SET", REDIS_KEY, data, *extra))
        if self.state_file:
            try:
                self.state_file.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.state_file.with_suffix(".tmp")
                tmp.write_text(data)
                tmp.replace(self.state_file)
            except OSError as exc:
                raise StoreUnavailable(f"runtime config: cannot write {self.state_file}: "
                                       f"{exc}", retry_after_s=5) from exc
        return True

    async def restore(self) -> None:
        """Take persisted values over the seed (the seed only fills what was never saved).

        With Redis, then keep them there (see the class docstring); :meth:`close` stops that.
        """
        await self._restore_once()
        if self.redis_url and (self._keeper is None or self._keeper.done()):
            self._keeper = asyncio.create_task(self._keep(), name="runtime-config-keeper")

    async def reload(self) -> None:
        """Read the persisted values again (another coordinator changed them)."""
        async with self._lock:
            await self._restore_once()

    async def _restore_once(self) -> None:
        try:
            stored = await self._read()
        except (OSError, ValueError, StoreUnavailable) as exc:
            log.warning("could not read persisted runtime config: %s", exc)
            return
        self._restored = True
        if stored:
            merged = {**self.values.wire(), **stored}
            try:
                self.values = RuntimeValues.model_validate(merged)
            except ValidationError as exc:
                log.warning("ignoring invalid persisted runtime config: %s", exc)

    async def _keep(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.keep_interval_s)
                return
            try:
                await self.keep_persisted()
            except Exception as exc:  # the keeper never dies; the next round retries
                log.warning("runtime config: checking the persisted copy failed: %s", exc)

    async def keep_persisted(self) -> None:
        """Write the values in effect back to Redis if the key is gone (never overwrites).

        If the startup read failed, the persisted values are read now instead.
        """
        async with self._lock:
            if not self._restored:
                await self._restore_once()
            elif await self._write(self.values, only_if_missing=True):
                log.warning("runtime config was missing from Redis; re-written: %s",
                            self.values.wire())

    async def update(self, patch: Any) -> dict[str, Any]:
        """Validate, persist, then apply; a failed write changes nothing (StoreUnavailable)."""
        if not isinstance(patch, dict):
            raise BadRequest("config update must be a JSON object")
        async with self._lock:
            try:
                updated = RuntimeValues.model_validate({**self.values.wire(), **patch})
            except ValidationError as exc:
                err = exc.errors()[0]
                field = ".".join(str(p) for p in err["loc"]) or None
                raise BadRequest(f"{field}: {err['msg']}", param=field) from exc
            await self._write(updated)
            self.values = updated
        return self.values.wire()

    async def close(self) -> None:
        """Stop the keeper."""
        if self._keeper is not None:
            self._closing.set()  # as well as cancel: redis-py can swallow a cancel mid-command
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
            self._keeper = None
            self._closing.clear()
