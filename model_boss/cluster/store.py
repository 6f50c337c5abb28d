"""ClusterStore: the one seam between the cluster and Redis.

Keys, all under ``<prefix>:cluster:``:

- ``member:<host id>`` — the member's record (JSON), with a TTL its heartbeat renews; a
  member whose key lapses is out;
- ``members`` — the set of host ids ever seen, pruned of those whose key has lapsed;
- ``load:<model>`` — the load lock: the host id chosen to load the model, SET NX PX, so a
  burst sent to every member loads it once; a member that dies holding it loses it by TTL;
- ``learned`` — a hash of model id → learned figures (VRAM, load and inference seconds);
- channel ``notices`` — change notices (``{"kind": "slots" | "config" | "left", "host"}``);
  readers then read the keys, the notice itself carries nothing else.

Redis errors leave as :class:`~model_boss.errors.StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ..errors import StoreUnavailable
from ..gpu.redis_store import redact
from .records import MemberRecord

log = logging.getLogger(__name__)

LISTEN_POLL_S = 1.0  # the notice listener looks at its stop flag at least this often

# KEYS[1] lock; ARGV: host id, ttl ms. {1, host} when taken, else {0, the holder}.
TAKE_OR_TELL = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1, ARGV[1]} end
return {0, redis.call('GET', KEYS[1]) or ''}
"""
# KEYS[1] lock; ARGV: host id, ttl ms (0: delete). Only while it still names that host.
KEEP_IF = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) <= 0 then return redis.call('DEL', KEYS[1]) end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""

Notice = dict[str, Any]


class ClusterStore:
    """Membership, load locks, shared learned figures and notices over one Redis."""

    def __init__(self, url: str, prefix: str = "model-boss", *, timeout_s: float = 5.0) -> None:
        self.url = url
        self.base = f"{prefix}:cluster"
        self._redis = redis.from_url(
            url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)))
        self._take = self._redis.register_script(TAKE_OR_TELL)
        self._keep = self._redis.register_script(KEEP_IF)

    @property
    def channel(self) -> str:
        return f"{self.base}:notices"

    def _member_key(self, host_id: str) -> str:
        return f"{self.base}:member:{host_id}"

    @property
    def client(self) -> redis.Redis:
        """The Redis client, for a room of the cluster with its own keys (tenants.py)."""
        return self._redis

    def unavailable(self, exc: Exception) -> StoreUnavailable:
        return self._unavailable(exc)

    async def call(self, command: str, *args: Any) -> Any:
        """One Redis command; StoreUnavailable when Redis cannot answer."""
        return await self._call(command, *args)

    def _unavailable(self, exc: Exception) -> StoreUnavailable:
        return StoreUnavailable(f"cluster: Redis at {redact(self.url)} unreachable: {exc}",
                                retry_after_s=5)

    async def _call(self, command: str, *args: Any) -> Any:
        try:
            return await self._redis.execute_command(command, *args)
        except redis.RedisError as exc:
            raise self._unavailable(exc) from exc

    # -- membership -------------------------------------------------------------------

    async def register(self, record: MemberRecord, ttl_s: float) -> None:
        """Write this member's record with its TTL (the heartbeat)."""
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(self._member_key(record.host_id), json.dumps(record.to_dict()),
                         px=int(ttl_s * 1000))
                pipe.sadd(f"{self.base}:members", record.host_id)
                await pipe.execute()
        except redis.RedisError as exc:
            raise self._unavailable(exc) from exc

    async def leave(self, host_id: str) -> None:
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(self._member_key(host_id))
                pipe.srem(f"{self.base}:members", host_id)
                await pipe.execute()
        except redis.RedisError as exc:
            raise self._unavailable(exc) from exc

    async def members(self) -> list[MemberRecord]:
        """Every member whose heartbeat is current; lapsed ones leave the set."""
        ids = sorted(i.decode() for i in await self._call("SMEMBERS", f"{self.base}:members"))
        if not ids:
            return []
        raws = await self._call("MGET", *[self._member_key(i) for i in ids])
        gone = [i for i, raw in zip(ids, raws, strict=True) if raw is None]
        if gone:
            await self._call("SREM", f"{self.base}:members", *gone)
        records = []
        for raw in raws:
            if raw is not None:
                try:
                    records.append(MemberRecord.from_dict(json.loads(raw)))
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("ignoring an unreadable member record: %s", exc)
        return records

    async def is_member(self, host_id: str) -> bool:
        return bool(await self._call("EXISTS", self._member_key(host_id)))

    # -- load locks -------------------------------------------------------------------

    async def take_load(self, model: str, host_id: str, ttl_s: float) -> tuple[bool, str]:
        """Name ``host_id`` the loader of ``model`` unless another is named: (taken, loader)."""
        try:
            taken, holder = await self._take(keys=[f"{self.base}:load:{model}"],
                                             args=[host_id, int(ttl_s * 1000)])
        except redis.RedisError as exc:
            raise self._unavailable(exc) from exc
        return bool(taken), holder.decode() if isinstance(holder, bytes) else str(holder)

    async def keep_load(self, model: str, host_id: str, ttl_s: float) -> bool:
        """Extend (``ttl_s`` > 0) or drop (0) the lock, only while it names ``host_id``."""
        try:
            return bool(await self._keep(keys=[f"{self.base}:load:{model}"],
                                         args=[host_id, int(ttl_s * 1000)]))
        except redis.RedisError as exc:
            raise self._unavailable(exc) from exc

    # -- shared learned figures -------------------------------------------------------

    async def share_learned(self, figures: dict[str, dict[str, Any]]) -> None:
        if figures:
            await self._call("HSET", f"{self.base}:learned",
                             *[x for k, v in figures.items() for x in (k, json.dumps(v))])

    async def learned(self) -> dict[str, dict[str, Any]]:
        raw = await self._call("HGETALL", f"{self.base}:learned")
        pairs = dict(zip(raw[::2], raw[1::2], strict=True)) if isinstance(raw, list) else raw
        return {k.decode(): json.loads(v) for k, v in pairs.items()}

    # -- notices ----------------------------------------------------------------------

    async def notify(self, kind: str, host_id: str, **fields: Any) -> None:
        await self._call("PUBLISH", self.channel,
                         json.dumps({"kind": kind, "host": host_id, **fields}))

    async def listen(self, on_notice: Callable[[Notice], None], retry_s: float = 0.5,
                     until: asyncio.Event | None = None) -> None:
        """Call ``on_notice`` for every notice until ``until`` is set (or forever); reconnects
        after Redis goes away (notices sent meanwhile are lost; the heartbeat's full read
        covers them). ``until`` is looked at between reads, at most ``LISTEN_POLL_S`` apart,
        so the listener ends even when the cancel meant to end it is lost."""
        stop = until or asyncio.Event()
        client = redis.from_url(self.url, socket_connect_timeout=5)
        try:
            while not stop.is_set():
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                try:
                    await pubsub.subscribe(self.channel)
                    while not stop.is_set():
                        message = await pubsub.get_message(timeout=LISTEN_POLL_S)
                        if message is not None and message.get("type") == "message":
                            _deliver(on_notice, message["data"])
                except redis.RedisError as exc:
                    log.debug("cluster notices: %s; reconnecting", exc)
                    await asyncio.sleep(retry_s)
                finally:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()
        finally:
            with contextlib.suppress(Exception):
                await client.aclose()

    async def close(self) -> None:
        await self._redis.aclose()


def _deliver(on_notice: Callable[[Notice], None], data: bytes) -> None:
    try:
        notice = json.loads(data)
    except ValueError:
        return
    if isinstance(notice, dict):
        try:
            on_notice(notice)
        except Exception:  # a listener's bug never stops the notices
            log.exception("cluster notice handler failed on %s", notice)
