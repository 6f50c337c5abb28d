"""UsageLedger: one row per finished request, recorded on the event loop without I/O and
written to SQLite in batches by one writer thread."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ...errors import ModelBossError
from . import schema
from .periods import HOUR_S, hour_of
from .query import UsageQuery, group_names, run_query
from .row import UsageRow
from .totals import KEPT_S, HourlyTotals, Spender, Spent

log = logging.getLogger(__name__)

# rows that may wait for a write that keeps failing; past it the oldest are dropped
MAX_WAITING = 100_000
# the longest pause between tries while writes fail
MAX_RETRY_S = 30.0

Connect = Callable[[str], sqlite3.Connection]


class LedgerUnavailable(ModelBossError):
    """The ledger could not write the rows a query must see (disk full, file locked)."""

    status_code = 503
    error_type = "server_error"
    code = "usage_unavailable"


class UsageLedger:
    """The usage of every finished request. ``record`` (on the loop) appends to a list and
    adds to the running totals; a background task hands the waiting rows to the writer
    thread every ``flush_s`` seconds, or as soon as ``batch`` rows wait, and the thread
    writes them in one transaction. ``path`` None keeps the rows in a database in memory
    (tests, ``state_dir`` off): queries run the same SQL either way.

    ``connect`` is the seam tests use to make writes fail."""

    def __init__(self, path: Path | None, *, flush_s: float = 0.25, batch: int = 1000,
                 connect: Connect = schema.connect) -> None:
        if batch < 1 or flush_s <= 0:
            raise ValueError(f"batch must be ≥ 1 and flush_s > 0 (got {batch}, {flush_s})")
        self.path = path
        self.flush_s = flush_s
        self.batch = batch
        self.dropped = 0  # rows let go because writes kept failing past MAX_WAITING
        self.written = 0
        self._connect = connect
        self._waiting: deque[UsageRow] = deque()
        self._writing = 0  # rows a write has taken from _waiting and not yet ended
        self._totals = HourlyTotals()
        self._wake = asyncio.Event()
        self._flushing = asyncio.Lock()
        self._writer: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None  # the writer thread's
        self._task: asyncio.Task[None] | None = None
        self._stopping = False  # the writer loop ends after its current write
        self._closed = False

    # -- the request path ------------------------------------------------------------------

    def record(self, row: UsageRow) -> None:
        """Keep ``row`` (cheap: no I/O; the writer picks it up)."""
        self._waiting.append(row)
        if len(self._waiting) > MAX_WAITING:
            self._waiting.popleft()
            self.dropped += 1
        self._totals.add(row)
        if len(self._waiting) % self.batch == 0:  # once per full batch, not on every row
            self._wake.set()

    def spent(self, key: str, since: float) -> Spent:
        """What ``key`` used from ``since`` on (whole hours, up to 31 days back), from the
        totals in memory."""
        return self._totals.spent(key, since)

    def end_user_spent(self, key: str, end_user: str, since: float) -> Spent:
        """What ``end_user`` under ``key`` used from ``since`` on, as :meth:`spent`."""
        return self._totals.spent((key, end_user), since)

    @property
    def waiting(self) -> int:
        """Rows recorded and not yet written (those a write is taking now among them)."""
        return len(self._waiting) + self._writing

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Open (or create) the database, seed the running totals from its last 31 days,
        and start writing in the background."""
        if self._task is not None:
            return
        self._closed = self._stopping = False
        async with self._flushing:
            try:
                seeded = await self._in_writer(self._seed_rows, time.time() - KEPT_S)
            except Exception as exc:  # serve anyway; the writer keeps trying the file
                log.error("usage ledger: cannot read %s (%s: %s); quotas count from now",
                          self._target(), type(exc).__name__, exc)
                seeded = []
            totals = HourlyTotals()
            for key, hour, spent in seeded:
                totals.seed(key, hour, spent)
            for row in self._waiting:  # recorded, not in the file yet
                totals.add(row)
            self._totals = totals
        self._task = asyncio.create_task(self._run(), name="usage-ledger")

    async def stop(self) -> None:
        """Write every waiting row and close the database (a second call does nothing)."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            # asked to end rather than cancelled: it finishes the write it may be in, and a
            # cancel racing a finished wait (asyncio.wait_for before 3.12) cannot be lost
            self._stopping = True
            self._wake.set()
            await asyncio.wait([self._task])  # ends by itself (or was cancelled with its loop)
            self._task = None
        if self._writer is None and not self._waiting:
            return
        if not await self._write_waiting():
            log.error("usage ledger: %d rows could not be written at stop and are lost",
                      len(self._waiting))
        await self._in_writer(self._close)
        if self._writer is not None:
            self._writer.shutdown(wait=False)  # its last work is done
            self._writer = None

    async def flush(self) -> None:
        """Write every row recorded before this call; LedgerUnavailable when the write
        fails (the rows stay waiting for the next try)."""
        if not await self._write_waiting():
            raise LedgerUnavailable(f"the usage ledger cannot write to {self._target()} "
                                    "now; try again", retry_after_s=self.flush_s + 1)

    # -- reading ---------------------------------------------------------------------------

    async def query(self, *, start: float | None, end: float | None, group_by: list[str],
                    key: str | None = None, model: str | None = None,
                    endpoint: str | None = None) -> list[dict[str, Any]]:
        """Rows with ``start <= at < end``, optionally of one key / model / endpoint, grouped
        by ``group_by`` (key, end_user, model, endpoint, outcome, day, hour, member): the
        group columns, ``requests`` and every SUMMED figure, ordered by the groups."""
        question = UsageQuery(tuple(group_names(group_by)), start, end, key, model, endpoint)
        await self.flush()
        if self.path is None:  # the database in memory lives on the writer's connection
            return await self._in_writer(lambda: run_query(self._open(), question))
        await self._in_writer(self._open)  # the table exists before a reader looks
        return await asyncio.to_thread(self._read, question)

    def _read(self, question: UsageQuery) -> list[dict[str, Any]]:
        conn = self._connect(str(self.path))  # a reader of its own: WAL lets it beside the writer
        try:
            return run_query(conn, question)
        finally:
            conn.close()

    # -- the writer ------------------------------------------------------------------------

    async def _run(self) -> None:
        """Write what waits every flush_s (sooner when a batch is full); never dies, and
        waits longer between tries while writes fail."""
        pause, failing = self.flush_s, False
        while not self._stopping:
            try:
                await self._pause(pause, woken=not failing)
                if self._stopping:
                    break  # stop() writes what waits
                failing = not await self._write_waiting()
            except Exception:
                log.exception("usage ledger: the writer loop failed; carrying on")
                failing = True
            pause = min(pause * 2, MAX_RETRY_S) if failing else self.flush_s

    async def _pause(self, seconds: float, *, woken: bool) -> None:
        """Wait ``seconds``, less when a full batch wakes it (``woken``) or stop() does."""
        deadline = asyncio.get_running_loop().time() + seconds
        while not self._stopping:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._wake.wait()
            if self._wake.is_set():
                self._wake.clear()
                if woken:
                    return

    async def _write_waiting(self) -> bool:
        """Write every waiting row in one transaction; on failure log, put them back in
        front (the bound applies) and answer False."""
        async with self._flushing:
            if not self._waiting:
                return True
            rows = list(self._waiting)
            self._waiting.clear()
            self._writing = len(rows)
            try:
                await self._in_writer(self._insert, rows)
            except Exception as exc:  # disk full, locked, unwritable folder: try again later
                log.warning("usage ledger: writing %d rows to %s failed (%s: %s); keeping "
                            "them for the next try", len(rows), self._target(),
                            type(exc).__name__, exc)
                self._waiting.extendleft(reversed(rows))
                while len(self._waiting) > MAX_WAITING:
                    self._waiting.popleft()
                    self.dropped += 1
                return False
            finally:
                self._writing = 0
            self.written += len(rows)
            return True

    async def _in_writer(self, work: Callable[..., Any], *args: Any) -> Any:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="usage-ledger")
        return await asyncio.get_running_loop().run_in_executor(self._writer, work, *args)

    # the functions below run on the writer thread, the one user of self._conn

    def _target(self) -> str:
        return ":memory:" if self.path is None else str(self.path)

    def _open(self) -> sqlite3.Connection:
        if self._conn is None:
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = self._connect(self._target())
            try:
                schema.create(conn)
                if self.path is not None:  # who used what is no one else's business
                    self.path.chmod(0o600)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _insert(self, rows: list[UsageRow]) -> None:
        schema.insert(self._open(), rows)

    def _seed_rows(self, since: float) -> list[tuple[Spender, int, Spent]]:
        """Each key's hours since ``since``, then each end user's under a key."""
        conn = self._open()
        sums = ("COUNT(*), SUM(prompt_tokens + completion_tokens), SUM(images), "
                "SUM(audio_seconds), SUM(gpu_seconds)")
        hour = f"CAST(at / {HOUR_S} AS INTEGER) AS hour"
        start = (hour_of(since) * HOUR_S,)
        found: list[tuple[Spender, int, Spent]] = [
            (key, at, Spent(n, tokens, images, audio, gpu))
            for key, at, n, tokens, images, audio, gpu in conn.execute(
                f"SELECT key, {hour}, {sums} FROM usage WHERE at >= ? GROUP BY key, hour",
                start)]
        found += [((key, end_user), at, Spent(n, tokens, images, audio, gpu))
                  for key, end_user, at, n, tokens, images, audio, gpu in conn.execute(
                      f"SELECT key, end_user, {hour}, {sums} FROM usage WHERE at >= ? AND "
                      "key != '' AND end_user != '' GROUP BY key, end_user, hour", start)]
        return found

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
