"""RedisLeaseStore: leases shared by every process and host that points at one Redis.

Each operation that reads and writes is one Lua script, so an acquire is atomic across
processes and hosts: expired leases are dropped (Redis ``TIME`` is the one clock), live ones
summed per GPU, and the new lease is written only if every GPU it asks for has room.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qsl, urlencode, urlsplit

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ..errors import StoreUnavailable
from .lease import Lease

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
"""

# Drops expired leases; leaves the live ones, encoded and decoded, in `live` and `held`.
_REAP = _NOW + """
local all = redis.call('HGETALL', KEYS[1])
local live, held = {}, {}
for i = 1, #all, 2 do
  local lease = cjson.decode(all[i + 1])
  if tonumber(lease.expires_at) <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    table.insert(live, all[i + 1])
    table.insert(held, lease)
  end
end
"""

# KEYS[1] leases hash; ARGV: lease JSON, limits JSON ({"gpu": MB}), ttl_s.
# Returns {1, expires_at} when granted, {0, reason} (nothing written) when not.
# Also the re-assert of a lost lease: a live lease with the same id is replaced, not counted.
ACQUIRE = _REAP + """
local lease = cjson.decode(ARGV[1])
local used = {}
for _, other in ipairs(held) do
  if other.id ~= lease.id then
    for gpu, mb in pairs(other.allocations) do
      used[gpu] = (used[gpu] or 0) + tonumber(mb)
    end
  end
end
local limits = cjson.decode(ARGV[2])
local order = {}
for gpu in pairs(lease.allocations) do table.insert(order, gpu) end
table.sort(order, function(a, b) return tonumber(a) < tonumber(b) end)
for _, gpu in ipairs(order) do
  local limit = limits[gpu]
  if limit == nil then return {0, 'unknown GPU ' .. gpu} end
  local asked = tonumber(lease.allocations[gpu])
  if (used[gpu] or 0) + asked > tonumber(limit) then return {0, 'GPU ' .. gpu .. ' full'} end
end
lease.expires_at = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], lease.id, cjson.encode(lease))
return {1, tostring(lease.expires_at)}
"""

# KEYS[1] leases hash; ARGV: lease id, ttl_s. Returns the renewed lease JSON, or nil.
RENEW = _NOW + """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return false end
local lease = cjson.decode(raw)
if tonumber(lease.expires_at) <= now then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return false
end
lease.ttl_s = tonumber(ARGV[2])
lease.expires_at = now + tonumber(ARGV[2])
local encoded = cjson.encode(lease)
redis.call('HSET', KEYS[1], ARGV[1], encoded)
return encoded
"""

LIVE = _REAP + """
return live
"""


def redact(url: str) -> str:
    """``url`` without its password, for error messages that may reach API clients."""
    parts = urlsplit(url)
    netloc, query = parts.netloc, parse_qsl(parts.query, keep_blank_values=True)
    if parts.password is None and all(key != "password" for key, _ in query):
        return url
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rsplit('@', 1)[1]}"
    hidden = urlencode([(k, "***" if k == "password" else v) for k, v in query], safe="*")
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{hidden}" if hidden else "")


class RedisLeaseStore:
    """The :class:`~model_boss.gpu.lease.LeaseStore` over Redis (``redis://`` URL).

    Leases live in one hash ``<prefix>:leases`` (lease id → JSON), the published GPU
    inventory in ``<prefix>:gpus``. Redis errors leave as :class:`StoreUnavailable`.
    """

    def __init__(self, url: str, prefix: str = "model-boss", *,
                 timeout_s: float = 10.0) -> None:
        self.url = url
        self.prefix = prefix
        # A pooled connection a Redis restart closed is reconnected once, at once: scripts
        # are idempotent for a given lease id, and a closed connection ran nothing.
        self._redis = redis.from_url(
            url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)))
        self._acquire = self._redis.register_script(ACQUIRE)
        self._renew = self._redis.register_script(RENEW)
        self._live = self._redis.register_script(LIVE)

    @property
    def _leases_key(self) -> str:
        return f"{self.prefix}:leases"

    @property
    def _gpus_key(self) -> str:
        return f"{self.prefix}:gpus"

    def _unavailable(self, exc: redis.RedisError) -> StoreUnavailable:
        how = "unreachable" if isinstance(exc, redis.ConnectionError | redis.TimeoutError) \
            else "failed"
        return StoreUnavailable(f"lease store: Redis at {redact(self.url)} {how}: {exc}",
                                retry_after_s=5)

    async def acquire(self, lease: Lease, limits: dict[int, int]) -> bool:
        data = lease.to_dict()
        data.pop("vram_mb", None)  # derived; not stored
        try:
            granted, value = await self._acquire(
                keys=[self._leases_key],
                args=[json.dumps(data), json.dumps({str(k): v for k, v in limits.items()}),
                      lease.ttl_s])
        except redis.RedisError as exc:
            raise self._unavailable(exc) from exc
        if int(granted) != 1:
            return False
        lease.expires_at = float(value)
        return True

    async def reassert(self, lease: Lease, limits: dict[int, int]) -> bool:
        """The acquire script under the lease's own id (see :meth:`LeaseStore.reassert`)."""
        return await self.acquire(lease, limits)

    async def renew(self, lease_id: str, ttl_s: float) -> Lease | None:
        try:
            raw = await self._renew(keys=[self._leases_key], args=[lease_id, ttl_s])
        except redis.RedisError as exc:
            raise self._unavailable(exc) from exc
        return Lease.from_dict(json.loads(raw)) if raw else None

    async def release(self, lease_id: str) -> bool:
        try:
            return bool(await self._redis.hdel(self._leases_key, lease_id))
        except redis.RedisError as exc:
            raise self._unavailable(exc) from exc

    async def list(self) -> list[Lease]:
        try:
            raws = await self._live(keys=[self._leases_key])
        except redis.RedisError as exc:
            raise self._unavailable(exc) from exc
        return [Lease.from_dict(json.loads(raw)) for raw in raws]

    async def publish_inventory(self, gpus: list[dict]) -> None:
        try:
            await self._redis.set(self._gpus_key, json.dumps(gpus))
        except redis.RedisError as exc:
            raise self._unavailable(exc) from exc

    async def inventory(self) -> list[dict]:
        try:
            raw = await self._redis.get(self._gpus_key)
        except redis.RedisError as exc:
            raise self._unavailable(exc) from exc
        return json.loads(raw) if raw else []

    async def close(self) -> None:
        await self._redis.aclose()
