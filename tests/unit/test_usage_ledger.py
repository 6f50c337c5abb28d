"""UsageLedger: rows recorded on the loop, written in batches, summed by SQL and in memory."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest

from model_boss.errors import BadRequest
from model_boss.tenancy.usage import (
    SUMMED,
    LedgerUnavailable,
    UsageLedger,
    UsageRow,
    day_start,
    month_start,
)
from model_boss.tenancy.usage import ledger as ledger_module

T0 = datetime(2025, 5, 10, 22, 30, tzinfo=UTC).timestamp()  # a Saturday, 22:30 UTC
INTS = ("prompt_tokens", "completion_tokens", "cached_tokens", "images", "steps")


def row(key: str = "team-a", model: str = "smollm2", at: float = T0, **figures) -> UsageRow:
    return UsageRow(key=key, end_user=figures.pop("end_user", ""), model=model,
                    endpoint=figures.pop("endpoint", "chat"),
                    outcome=figures.pop("outcome", "ok"), http_status=200, at=at, **figures)


def random_rows(n: int, seed: int = 7) -> list[UsageRow]:
    rng = random.Random(seed)
    return [row(key=rng.choice(["team-a", "team-b", ""]), model=rng.choice(["m1", "m2", "m3"]),
                at=T0 + rng.uniform(0, 3 * 86400), prompt_tokens=rng.randint(0, 500),
                completion_tokens=rng.randint(0, 500), cached_tokens=rng.randint(0, 50),
                images=rng.randint(0, 2), steps=rng.randint(0, 30),
                audio_seconds=rng.uniform(0, 5), gpu_seconds=rng.uniform(0, 3),
                vram_mb_seconds=rng.uniform(0, 9000), load_seconds=rng.uniform(0, 1),
                queue_wait_s=rng.uniform(0, 2), duration_s=rng.uniform(0, 4))
            for _ in range(n)]


def python_sums(rows: list[UsageRow], *groups: str) -> dict[tuple, dict]:
    sums: dict[tuple, dict] = defaultdict(lambda: {"requests": 0, **dict.fromkeys(SUMMED, 0)})
    for r in rows:
        total = sums[tuple(getattr(r, g) for g in groups)]
        total["requests"] += 1
        for name in SUMMED:
            total[name] += getattr(r, name)
    return sums


def assert_matches(answer: list[dict], expected: dict[tuple, dict], *groups: str) -> None:
    assert len(answer) == len(expected)
    for got in answer:
        want = expected[tuple(got[g] for g in groups)]
        assert got["requests"] == want["requests"]
        for name in SUMMED:
            if name in INTS:
                assert got[name] == want[name] and isinstance(got[name], int), name
            else:
                assert got[name] == pytest.approx(want[name], abs=1e-5), name


@pytest.fixture
async def ledger(tmp_path: Path):
    book = UsageLedger(tmp_path / "state" / "usage.sqlite3", flush_s=0.05)
    await book.start()
    yield book
    await book.stop()


async def test_five_thousand_rows_sum_as_python_sums_them(ledger: UsageLedger) -> None:
    rows = random_rows(5000)
    for r in rows:
        ledger.record(r)
    answer = await ledger.query(start=None, end=None, group_by=["key", "model"])
    assert_matches(answer, python_sums(rows, "key", "model"), "key", "model")
    assert [(r["key"], r["model"]) for r in answer] == sorted((r["key"], r["model"])
                                                              for r in answer)
    assert ledger.written == 5000 and ledger.waiting == 0


async def test_the_writer_writes_without_being_asked(tmp_path: Path, ledger: UsageLedger) -> None:
    ledger.record(row())
    for _ in range(100):
        if ledger.written:
            break
        await asyncio.sleep(0.02)
    assert ledger.written == 1
    with contextlib.closing(sqlite3.connect(ledger.path)) as conn:
        assert conn.execute("SELECT key, model FROM usage").fetchall() == [("team-a", "smollm2")]
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_a_full_batch_is_written_before_flush_s(tmp_path: Path) -> None:
    book = UsageLedger(tmp_path / "usage.sqlite3", flush_s=60, batch=10)
    await book.start()
    try:
        for _ in range(10):
            book.record(row())
        for _ in range(100):
            if book.written:
                break
            await asyncio.sleep(0.02)
        assert book.written == 10
    finally:
        await book.stop()


async def test_a_restart_keeps_the_rows_and_seeds_spent(tmp_path: Path) -> None:
    path = tmp_path / "usage.sqlite3"
    now = datetime.now(UTC).timestamp()
    first = UsageLedger(path)
    await first.start()
    first.record(row(at=now - 40 * 86400, prompt_tokens=1000))  # older than any quota period
    first.record(row(at=now - 2, prompt_tokens=10, completion_tokens=5, images=1,
                     audio_seconds=1.5, gpu_seconds=2.25))
    first.record(row(key="team-b", at=now - 1, prompt_tokens=7))
    before = first.spent("team-a", day_start(now))
    await first.stop()
    await first.stop()  # a second stop does nothing

    second = UsageLedger(path)
    await second.start()
    try:
        assert second.spent("team-a", day_start(now)) == before
        spent = second.spent("team-a", month_start(now))
        assert (spent.requests, spent.tokens, spent.images) == (1, 15, 1)
        assert (spent.audio_seconds, spent.gpu_seconds) == (1.5, 2.25)
        assert second.spent("team-b", day_start(now)).tokens == 7
        assert second.spent("nobody", 0).requests == 0
        every = await second.query(start=None, end=None, group_by=["key"])
        assert [(r["key"], r["requests"]) for r in every] == [("team-a", 2), ("team-b", 1)]
    finally:
        await second.stop()


async def test_spent_counts_from_the_hour_of_since(ledger: UsageLedger) -> None:
    ledger.record(row(at=T0 - 86400, completion_tokens=100))  # the day before
    ledger.record(row(at=T0, completion_tokens=10))  # 22:30
    ledger.record(row(at=T0 + 3600, completion_tokens=1))  # 23:30
    assert ledger.spent("team-a", day_start(T0)).tokens == 11
    assert ledger.spent("team-a", T0 + 600).tokens == 11  # 22:40: all of 22:00's hour
    assert ledger.spent("team-a", T0 + 1800).tokens == 1  # 23:00
    assert ledger.spent("team-a", 0).requests == 3


async def test_day_and_hour_grouping(ledger: UsageLedger) -> None:
    ledger.record(row(at=T0))  # 2025-05-10 22:30
    ledger.record(row(at=T0 + 600))  # 22:40
    ledger.record(row(at=T0 + 3600))  # 23:30
    ledger.record(row(at=T0 + 7200, model="other"))  # 2025-05-11 00:30
    days = await ledger.query(start=None, end=None, group_by=["day"])
    assert [(r["day"], r["requests"]) for r in days] == [("2025-05-10", 3), ("2025-05-11", 1)]
    hours = await ledger.query(start=None, end=None, group_by=["hour", "model"])
    assert [(r["hour"], r["model"], r["requests"]) for r in hours] == [
        ("2025-05-10T22:00Z", "smollm2", 2), ("2025-05-10T23:00Z", "smollm2", 1),
        ("2025-05-11T00:00Z", "other", 1)]


async def test_from_and_to_filter_and_the_filters_combine(ledger: UsageLedger) -> None:
    for n in range(10):
        ledger.record(row(at=T0 + n * 100, key="a" if n % 2 else "b", prompt_tokens=n))
    window = await ledger.query(start=T0 + 200, end=T0 + 500, group_by=[])
    assert [(r["requests"], r["prompt_tokens"]) for r in window] == [(3, 2 + 3 + 4)]
    only_a = await ledger.query(start=T0 + 200, end=None, group_by=["key"], key="a")
    assert [(r["key"], r["requests"]) for r in only_a] == [("a", 4)]  # 3, 5, 7, 9
    none = await ledger.query(start=T0 + 5000, end=None, group_by=[])
    assert none == []
    by_model = await ledger.query(start=None, end=None, group_by=["endpoint", "outcome"],
                                  model="nope")
    assert by_model == []


async def test_an_unknown_group_is_a_bad_request_naming_group_by(ledger: UsageLedger) -> None:
    with pytest.raises(BadRequest) as caught:
        await ledger.query(start=None, end=None, group_by=["key", "colour"])
    assert caught.value.param == "group_by"
    assert "colour" in caught.value.message


async def test_in_memory_mode_answers_the_same_way() -> None:
    book = UsageLedger(None)
    rows = random_rows(500, seed=3)
    for r in rows:
        book.record(r)  # before start: kept all the same
    await book.start()
    try:
        answer = await book.query(start=None, end=None, group_by=["model", "key"])
        assert_matches(answer, python_sums(rows, "model", "key"), "model", "key")
        assert book.spent("team-a", 0).requests == sum(r.key == "team-a" for r in rows)
    finally:
        await book.stop()


class FullDisk(sqlite3.Connection):
    """A connection whose inserts fail while ``failing`` is set."""

    failing = True

    def executemany(self, *args):
        if FullDisk.failing:
            raise sqlite3.OperationalError("database or disk is full")
        return super().executemany(*args)


def full_disk(target: str) -> sqlite3.Connection:
    return sqlite3.connect(target, factory=FullDisk, check_same_thread=False)


async def test_a_failing_write_keeps_the_rows_for_the_next_try(tmp_path: Path, caplog) -> None:
    FullDisk.failing = True
    book = UsageLedger(tmp_path / "usage.sqlite3", flush_s=0.02, connect=full_disk)
    await book.start()
    try:
        for n in range(3):
            book.record(row(prompt_tokens=n))
        with pytest.raises(LedgerUnavailable) as caught:
            await book.flush()
        assert caught.value.status_code == 503
        assert book.waiting == 3 and book.written == 0
        await asyncio.sleep(0.1)  # the writer loop tries too, and lives on
        assert "database or disk is full" in caplog.text and "keeping them" in caplog.text
        assert book.waiting == 3
        FullDisk.failing = False
        # the writer's next try, after its pause, writes them: the pause doubles with each
        # failed try (a slow box fails more of them in the tenth of a second above), so
        # wait out the longest pause there can be
        for _ in range(int((ledger_module.MAX_RETRY_S + 5) / 0.02)):
            if book.written:
                break
            await asyncio.sleep(0.02)
        assert (book.written, book.waiting) == (3, 0)
        answer = await book.query(start=None, end=None, group_by=["key"])
        assert [(r["requests"], r["prompt_tokens"]) for r in answer] == [(3, 0 + 1 + 2)]
    finally:
        FullDisk.failing = False
        await book.stop()


async def test_past_the_bound_the_oldest_waiting_rows_are_dropped(tmp_path: Path,
                                                                  monkeypatch) -> None:
    monkeypatch.setattr(ledger_module, "MAX_WAITING", 5)
    FullDisk.failing = True
    book = UsageLedger(tmp_path / "usage.sqlite3", flush_s=60, connect=full_disk)
    try:
        for n in range(8):
            book.record(row(prompt_tokens=n))
        assert (book.waiting, book.dropped) == (5, 3)
        with pytest.raises(LedgerUnavailable):
            await book.flush()
        FullDisk.failing = False
        answer = await book.query(start=None, end=None, group_by=[])
        assert answer[0]["prompt_tokens"] == 3 + 4 + 5 + 6 + 7  # the newest five
    finally:
        FullDisk.failing = False
        await book.stop()


async def test_record_does_no_io(tmp_path: Path) -> None:
    opened: list[str] = []

    def counting(target: str) -> sqlite3.Connection:
        opened.append(target)
        return sqlite3.connect(target, check_same_thread=False)

    book = UsageLedger(tmp_path / "usage.sqlite3", connect=counting)
    for _ in range(100):
        book.record(row())
    assert opened == [] and not (tmp_path / "usage.sqlite3").exists()
    await book.stop()  # never started: stop writes what waits all the same
    with contextlib.closing(sqlite3.connect(tmp_path / "usage.sqlite3")) as conn:
        assert conn.execute("SELECT COUNT(*) FROM usage").fetchone() == (100,)


def test_periods_are_utc() -> None:
    at = datetime(2025, 3, 31, 23, 59, 59, tzinfo=UTC).timestamp()
    assert day_start(at) == datetime(2025, 3, 31, tzinfo=UTC).timestamp()
    assert month_start(at) == datetime(2025, 3, 1, tzinfo=UTC).timestamp()


class SlowDisk(sqlite3.Connection):
    def executemany(self, *args):
        time.sleep(0.2)
        return super().executemany(*args)


async def test_stop_during_a_write_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "usage.sqlite3"
    book = UsageLedger(path, flush_s=0.01, batch=1, connect=lambda target: sqlite3.connect(
        target, factory=SlowDisk, check_same_thread=False))
    await book.start()
    book.record(row())
    await asyncio.sleep(0.05)  # the writer is inside its slow write
    book.record(row())
    await book.stop()
    assert book.written == 2
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT COUNT(*) FROM usage").fetchone() == (2,)
