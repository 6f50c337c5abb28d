"""Keys and usage shared by two members over one real Redis (model_boss/cluster/tenants.py):
a key made on one works on the other once its ``keys`` notice is handled there, and so does
its revocation (the notice is called here; tests/e2e/test_cluster_keys_e2e.py lets Redis carry
it between two real coordinators); both members' usage
counts against the same quota counters and one query answers for both; a batch sent twice
counts once; a Redis restarted empty gets its keys and counters back from the members."""

from __future__ import annotations

import time

import pytest

from model_boss.cluster.store import ClusterStore
from model_boss.cluster.tenants import SharedTenancy
from model_boss.cluster.usage_cells import increments
from model_boss.settings import ClientProfile, Settings
from model_boss.tenancy.keys import KeyStore
from model_boss.tenancy.usage import SUMMED, UsageLedger, UsageRow, day_start, month_start

pytestmark = [pytest.mark.redis]


class Member:
    """One member's keys, ledger and shared tenancy (as a coordinator wires them)."""

    def __init__(self, url: str, prefix: str, name: str, tmp_path) -> None:
        self.name = name
        self.keys = KeyStore(Settings(tasks_file=None, manifests=[], admin_api_key="adm"),
                             tmp_path / f"{name}.db")
        self.ledger = UsageLedger(None)
        self.store = ClusterStore(url, prefix=prefix)
        self.tenancy = SharedTenancy(self.store)

    async def start(self) -> Member:
        await self.keys.start()
        await self.ledger.start()
        await self.tenancy.attach(self.keys, self.ledger, self.name)
        return self

    def used(self, row: UsageRow) -> None:
        self.ledger.record(row)
        self.tenancy.add(row)

    async def stop(self) -> None:
        await self.tenancy.stop()
        await self.ledger.stop()
        await self.store.close()


def row(member: str, key: str, n: int, **extra) -> UsageRow:
    return UsageRow(key=key, end_user=f"user{n % 2}", model=f"m{n % 3}",
                    endpoint="/v1/chat/completions", outcome="ok", http_status=200,
                    member=member, prompt_tokens=10 + n, completion_tokens=n,
                    cached_tokens=n % 4, gpu_seconds=0.5 * n, vram_mb_seconds=100.0 * n,
                    **extra)


@pytest.fixture
async def members(redis_server, redis_prefix, tmp_path):
    a = await Member(redis_server.url, redis_prefix, "a", tmp_path).start()
    b = await Member(redis_server.url, redis_prefix, "b", tmp_path).start()
    try:
        yield a, b, redis_server
    finally:
        await a.stop()
        await b.stop()


def expected(rows: list[UsageRow], group_by: list[str]) -> dict[tuple, dict[str, float]]:
    sums: dict[tuple, dict[str, float]] = {}
    for r in rows:
        group = tuple(getattr(r, name) for name in group_by)
        cell = sums.setdefault(group, {"requests": 0, **{name: 0 for name in SUMMED}})
        cell["requests"] += 1
        for name in SUMMED:
            cell[name] += getattr(r, name)
    return sums


def answered(rows: list[dict], group_by: list[str]) -> dict[tuple, dict[str, float]]:
    return {tuple(r[name] for name in group_by): {k: v for k, v in r.items()
                                                  if k not in group_by} for r in rows}


async def test_a_key_made_on_one_member_works_on_the_other_until_revoked(members):
    a, b, _ = members
    record, secret = await a.keys.create("alice", ClientProfile(allowed_models=["qwen*"]))
    assert b.keys.lookup(secret) is None  # not before the notice is read
    await b.tenancy.keys_changed()
    found = b.keys.lookup(secret)
    assert found is not None and found.profile.allowed_models == ["qwen*"]
    await a.keys.revoke("alice")
    await b.tenancy.keys_changed()
    assert b.keys.lookup(secret).revoked  # refused there on its next request


async def test_both_members_count_against_one_quota_and_one_query(members):
    a, b, _ = members
    rows_a = [row("a", "k", n) for n in range(40)]
    rows_b = [row("b", "k", n) for n in range(25)] + [row("b", "other", 3)]
    for r in rows_a:
        a.used(r)
    for r in rows_b:
        b.used(r)
    # before either pushes, each member counts its own rows on top of the counters
    now = time.time()
    assert a.tenancy.spent("k", day_start(now)).requests == 40
    await a.tenancy.push()
    await b.tenancy.push()
    await a.keys.create("k", ClientProfile(tokens_per_day=10**9))
    await b.tenancy.keys_changed()
    for member in (a, b):
        await member.tenancy.refresh()
        for since in (day_start(now), month_start(now)):
            spent = member.tenancy.spent("k", since)
            assert spent.requests == 65
            assert spent.tokens == sum(r.tokens for r in rows_a + rows_b[:-1])
            assert spent.gpu_seconds == pytest.approx(sum(r.gpu_seconds
                                                          for r in rows_a + rows_b[:-1]))
    assert a.tenancy.spent("k", now - 60) is None  # any other period: the ledger's answer
    group_by = ["key", "model", "member"]
    for member in (a, b):
        rows = await member.tenancy.query(start=now - 3600, end=None, group_by=group_by)
        want = expected(rows_a + rows_b, group_by)
        got = answered(rows, group_by)
        assert set(got) == set(want)
        for group, sums in want.items():
            assert got[group] == pytest.approx(sums)
    only = await b.tenancy.query(start=None, end=None, group_by=["end_user"], key="other")
    assert only == [pytest.approx({"end_user": "user1", "requests": 1,
                                   **{name: getattr(rows_b[-1], name) for name in SUMMED}})]


async def test_a_batch_sent_twice_counts_once(members):
    a, _, _ = members
    from model_boss.cluster.usage_cells import batch_args

    marker = f"{a.tenancy.base}:usage:batch:twice"
    args = batch_args(increments([row("a", "k", 5)], a.tenancy.base))
    assert await a.tenancy._apply(keys=[marker], args=args) == 1
    assert await a.tenancy._apply(keys=[marker], args=args) == 0
    rows = await a.tenancy.query(start=None, end=None, group_by=["key"])
    assert rows[0]["requests"] == 1 and rows[0]["prompt_tokens"] == 15


async def test_a_redis_restarted_empty_gets_keys_and_counters_back(members, tmp_path):
    a, b, redis_server = members
    _, secret = await a.keys.create("kept", ClientProfile(tokens_per_day=1000))
    await b.tenancy.keys_changed()
    rows_a = [row("a", "kept", n) for n in range(10)]
    rows_b = [row("b", "kept", n) for n in range(7)]
    for r in rows_a:
        a.used(r)
    for r in rows_b:
        b.used(r)
    await a.tenancy.push()
    await b.tenancy.push()
    redis_server.restart()  # empty: no key, no counter
    late = row("a", "kept", 11)
    a.used(late)  # finished while Redis was away
    for member in (a, b):
        await member.tenancy.push()  # each gives its own history again, once
        await member.tenancy.reload_keys()
    rows = await b.tenancy.query(start=None, end=None, group_by=["member"])
    got = {r["member"]: r["requests"] for r in rows}
    assert got == {"a": 11, "b": 7}
    assert sum(r["prompt_tokens"] for r in rows) == sum(
        r.prompt_tokens for r in [*rows_a, late, *rows_b])
    newcomer = await Member(redis_server.url, a.tenancy.base.rsplit(":", 1)[0], "c",
                            tmp_path).start()
    try:
        assert newcomer.keys.lookup(secret) is not None  # the keys are back in Redis
    finally:
        await newcomer.stop()
