"""SharedTenancy: keys and usage shared by every member over the cluster's Redis, so a key
made on one member works on all, a revoked key is refused everywhere at once, every member's
usage counts against the same quotas, and one usage query answers for the whole cluster.

Keys, all under ``<prefix>:cluster:``:

- ``keys`` — a hash of key name → its record (JSON, the secret's hash only); a change is
  written here, then announced with a ``keys`` notice, on which every member reads it again;
- ``usage:day:<YYYY-MM-DD>:<key>`` and ``usage:month:<YYYY-MM>:<key>`` — what a key spent
  that day and month (requests, tokens, images, audio and GPU seconds): the quotas' counters;
- ``usage:hour:<hour>`` — every finished request's figures summed by hour, key, end user,
  model, endpoint, outcome and member: what ``GET /api/v1/usage`` answers from;
- ``usage:batch:<id>`` — a batch of rows already applied, so a batch sent again after a
  lost answer (Redis restarted as it replied) is not counted twice.

Each member keeps its own SQLite ledger too (its rows in full); the rows it finishes are
sent here in batches a quarter-second apart, and kept and sent again while Redis is away.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis.asyncio as redis

from ..errors import StoreUnavailable
from ..settings import QUOTAS
from ..tenancy.keys import KeyRecord, KeyStore
from ..tenancy.keys.store import record_from_dict, record_to_dict
from ..tenancy.usage import (
    Spent,
    UsageLedger,
    UsageRow,
    day_start,
    group_names,
    hour_of,
    month_start,
)
from .store import ClusterStore
from .usage_cells import (
    APPLY_BATCH,
    DIMENSIONS,
    HOUR_TTL_S,
    aggregate,
    batch_args,
    day_of,
    increments,
    month_of,
    seed_increments,
)

log = logging.getLogger(__name__)

PUSH_EVERY_S = 0.25
SNAPSHOT_EVERY_S = 1.0
MAX_OUTBOX = 100_000
QUOTA_FIGURES = ("requests", "tokens", "images", "audio_seconds", "gpu_seconds")



@dataclass(slots=True)
class _Pending:
    """A row counted here and not yet seen in a snapshot of the counters."""

    row: UsageRow
    pushed_at: float | None = None


class SharedTenancy:
    """Keys and usage over the cluster's Redis for one member (see the module's words)."""

    def __init__(self, store: ClusterStore) -> None:
        self.store = store
        self.base = store.base
        self._redis = store.client
        self._apply = self._redis.register_script(APPLY_BATCH)
        self._keys: KeyStore | None = None
        self._ledger: UsageLedger | None = None
        self.member = ""
        self._outbox: list[UsageRow] = []  # rows not in a batch yet
        self._unsent: list[tuple[str, list[UsageRow]]] = []  # (marker, rows) in order
        self._pending: list[_Pending] = []
        self._snapshot: dict[tuple[str, str], Spent] = {}  # (key, "day"|"month") → spent
        self._tasks: list[asyncio.Task] = []
        self.dropped = 0

    # -- keys --------------------------------------------------------------------------

    async def attach(self, keys: KeyStore, ledger: UsageLedger, member: str) -> None:
        """Share ``keys`` (this member's managed keys not in Redis, or newer here, are
        written there, then every member's are taken; changes from now on are written
        through and announced) and count this member's ``ledger`` in the cluster's usage."""
        self._keys, self._ledger, self.member = keys, ledger, member
        await self.reload_keys()
        keys.on_saved = self._saved

    async def reload_keys(self) -> None:
        """Take the keys as Redis has them (another member changed one); write there the
        ones this member has that Redis lacks or holds older (a Redis that restarted empty
        gets every member's keys back)."""
        if self._keys is None:
            return
        shared = await self._read_keys()
        for record in self._keys.managed():
            if record.name not in shared or shared[record.name].updated_at < record.updated_at:
                await self._write_key(record)
                shared[record.name] = record
        self._keys.adopt(shared.values())

    async def keys_changed(self) -> None:
        """A ``keys`` notice: read them again now (Redis away: the periodic read will)."""
        try:
            await self.reload_keys()
        except StoreUnavailable as exc:
            log.warning("cluster keys: %s; read again on the next sync", exc.message)

    async def _saved(self, record: KeyRecord) -> None:
        await self._write_key(record)
        with contextlib.suppress(StoreUnavailable):  # the periodic read covers a lost notice
            await self.store.notify("keys", "", name=record.name)

    async def _read_keys(self) -> dict[str, KeyRecord]:
        raw = await self.store.call("HGETALL", f"{self.base}:keys")
        pairs = dict(zip(raw[::2], raw[1::2], strict=True)) if isinstance(raw, list) else raw
        found = {}
        for name, value in pairs.items():
            try:
                record = record_from_dict(json.loads(value))
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("cluster keys: ignoring the unreadable record of %r: %s", name, exc)
                continue
            found[record.name] = record
        return found

    async def _write_key(self, record: KeyRecord) -> None:
        await self.store.call("HSET", f"{self.base}:keys", record.name,
                               json.dumps(record_to_dict(record)))

    # -- usage -------------------------------------------------------------------------

    def add(self, row: UsageRow) -> None:
        """A finished request of this member: sent with the next batch."""
        self._outbox.append(row)
        if row.key:
            self._pending.append(_Pending(row))
        waiting = len(self._outbox) + sum(len(rows) for _, rows in self._unsent)
        if waiting > MAX_OUTBOX and self._unsent:
            _, lost = self._unsent.pop(0)
            self.dropped += len(lost)
            log.error("cluster usage: Redis unreachable too long; %d rows not shared "
                      "(they are in this member's own ledger)", self.dropped)

    def spent(self, key: str, since: float, now: float | None = None) -> Spent | None:
        """What ``key`` spent in the cluster since the start of today or of this month (the
        counters' last snapshot plus this member's rows not in it yet); None for any other
        ``since`` (the member's own ledger answers)."""
        now = time.time() if now is None else now
        period = "day" if since == day_start(now) else "month" if since == month_start(now) \
            else None
        if period is None:
            return None
        base = self._snapshot.get((key, period), Spent())
        extra = [p.row for p in self._pending if p.row.key == key and p.row.at >= since]
        return Spent(requests=base.requests + len(extra),
                     tokens=base.tokens + sum(r.tokens for r in extra),
                     images=base.images + sum(r.images for r in extra),
                     audio_seconds=base.audio_seconds + sum(r.audio_seconds for r in extra),
                     gpu_seconds=base.gpu_seconds + sum(r.gpu_seconds for r in extra))

    async def query(self, *, start: float | None, end: float | None, group_by: list[str],
                    key: str | None = None, model: str | None = None,
                    endpoint: str | None = None) -> list[dict[str, Any]]:
        """The whole cluster's usage, hour by hour (``start`` and ``end`` taken to the hour
        they fall in: the counters keep hours), grouped and summed as the ledger's query."""
        group_by = group_names(group_by)
        await self.push()  # this member's own rows first
        now = time.time()
        first = hour_of(start if start is not None else now - 400 * 86400)
        last = hour_of((end if end is not None else now) - 1e-6)
        hours = list(range(first, last + 1))
        cells: dict[int, dict[str, float]] = {}
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for hour in hours:
                    pipe.hgetall(f"{self.base}:usage:hour:{hour}")
                answers = await pipe.execute()
        except redis.RedisError as exc:
            raise self.store.unavailable(exc) from exc
        for hour, answer in zip(hours, answers, strict=True):
            if answer:
                cells[hour] = {k.decode(): float(v) for k, v in answer.items()}
        return aggregate(cells, group_by, key=key, model=model, endpoint=endpoint)

    async def push(self) -> None:
        """Send the waiting rows, each batch applied once: a batch keeps its marker until
        Redis has answered for it (StoreUnavailable: kept for the next try). A Redis that
        lost this member's counters (restarted empty) is given them again from the ledger
        first."""
        if self._ledger is not None and not await self.store.call(
                "EXISTS", f"{self.base}:usage:seeded:{self.member}"):
            await self._seed()
        if self._outbox:
            self._unsent.append((f"{self.base}:usage:batch:{uuid.uuid4().hex}", self._outbox))
            self._outbox = []
        while self._unsent:
            marker, batch = self._unsent[0]
            try:
                await self._apply(keys=[marker], args=batch_args(increments(batch,
                                                                             self.base)))
            except redis.RedisError as exc:
                raise self.store.unavailable(exc) from exc
            self._unsent.pop(0)
            done = time.time()
            rows = {id(row) for row in batch}
            for pending in self._pending:
                if pending.pushed_at is None and id(pending.row) in rows:
                    pending.pushed_at = done

    async def _seed(self) -> None:
        """Send Redis what this member's ledger holds (rows finished before now, summed by
        hour), in place of the batches not sent yet (the ledger has those rows too), then
        mark this member seeded."""
        assert self._ledger is not None
        cut = time.time()
        kept = [row for row in self._outbox if row.at >= cut]
        self._outbox, self._unsent = kept, []
        summed = await self._ledger.query(start=cut - HOUR_TTL_S, end=cut,
                                          group_by=["hour", *DIMENSIONS])
        adds = seed_increments(summed, self.base)
        try:
            if adds:
                await self._apply(keys=[f"{self.base}:usage:batch:{uuid.uuid4().hex}"],
                                  args=batch_args(adds))
            await self._redis.set(f"{self.base}:usage:seeded:{self.member}", str(cut))
        except redis.RedisError as exc:
            raise self.store.unavailable(exc) from exc
        done = time.time()
        for pending in self._pending:  # the seed carried them
            if pending.pushed_at is None and pending.row.at < cut:
                pending.pushed_at = done
        if summed:
            log.info("cluster usage: gave Redis this member's %d hour(s) of usage again",
                     len({row["hour"] for row in summed}))

    async def refresh(self, now: float | None = None) -> None:
        """Read the day and month counters of the keys with quotas; rows pushed before the
        read began are in it from now on."""
        if self._keys is None:
            return
        now = time.time() if now is None else now
        began = time.time()
        limited = [r.name for r in self._keys if _has_quota(r)]
        snapshot: dict[tuple[str, str], Spent] = {}
        if limited:
            names = [(name, period, f"{self.base}:usage:{period}:{stamp}:{name}")
                     for name in limited
                     for period, stamp in (("day", day_of(now)), ("month", month_of(now)))]
            try:
                async with self._redis.pipeline(transaction=False) as pipe:
                    for _, _, hash_name in names:
                        pipe.hgetall(hash_name)
                    answers = await pipe.execute()
            except redis.RedisError as exc:
                raise self.store.unavailable(exc) from exc
            for (name, period, _), answer in zip(names, answers, strict=True):
                figures = {k.decode(): float(v) for k, v in (answer or {}).items()}
                snapshot[(name, period)] = Spent(
                    requests=int(figures.get("requests", 0)),
                    tokens=int(figures.get("tokens", 0)), images=int(figures.get("images", 0)),
                    audio_seconds=figures.get("audio_seconds", 0.0),
                    gpu_seconds=figures.get("gpu_seconds", 0.0))
        self._snapshot = snapshot
        self._pending = [p for p in self._pending if p.pushed_at is None or p.pushed_at >= began]

    # -- loops -------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._every(PUSH_EVERY_S, self.push),
                                           name="cluster-usage-push"),
                       asyncio.create_task(self._every(SNAPSHOT_EVERY_S, self.refresh),
                                           name="cluster-usage-snapshot"),
                       asyncio.create_task(self._every(5.0, self.reload_keys),
                                           name="cluster-keys")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        with contextlib.suppress(StoreUnavailable):
            await self.push()  # the last rows, while Redis is there

    async def _every(self, seconds: float, work: Any) -> None:
        """Run ``work`` every ``seconds``; never dies (Redis away: logged once, tried again)."""
        away = False
        while True:
            await asyncio.sleep(seconds)
            try:
                await work()
                if away:
                    log.info("cluster %s: Redis is back", work.__name__)
                away = False
            except StoreUnavailable as exc:
                if not away:
                    log.warning("cluster %s: %s; trying again", work.__name__, exc.message)
                away = True
            except Exception:
                log.exception("cluster %s failed", work.__name__)


def _has_quota(record: KeyRecord) -> bool:
    p = record.profile
    return not record.revoked and any(getattr(p, name) is not None for name in QUOTAS)
