"""ClusterStore against a real Redis: member records lapse with their TTL, the load lock
names one loader, notices arrive."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from model_boss.cluster import ClusterStore, MemberRecord, SlotRecord
from model_boss.cluster.store import LISTEN_POLL_S

pytestmark = pytest.mark.redis


async def until(read, expected) -> None:
    """Await ``read()`` until it returns ``expected`` (a TTL has to run out first)."""
    async with asyncio.timeout(5):
        while True:
            if await read() == expected:
                return
            await asyncio.sleep(0.02)


async def test_members_lapse_with_their_ttl(redis_url, redis_prefix):
    store = ClusterStore(redis_url, prefix=redis_prefix)
    try:
        lasting = MemberRecord("a", "http://a", "1", slots=(SlotRecord("m", "ready", "gpu"),))
        await store.register(lasting, ttl_s=30)
        await store.register(MemberRecord("b", "http://b", "1"), ttl_s=0.2)
        assert [m.host_id for m in await store.members()] == ["a", "b"]
        # b's TTL runs out: it is out, and leaves the set
        await until(lambda: store.members(), [lasting])
        assert not await store.is_member("b")
        await store.leave("a")
        assert await store.members() == []
    finally:
        await store.close()


async def test_the_load_lock_names_one_loader(redis_url, redis_prefix):
    store = ClusterStore(redis_url, prefix=redis_prefix)
    try:
        assert await store.take_load("m", "b", ttl_s=5) == (True, "b")
        assert await store.take_load("m", "c", ttl_s=5) == (False, "b")  # told who loads
        assert not await store.keep_load("m", "c", 5)  # only while it names that host
        assert await store.keep_load("m", "b", 0)  # dropped (a failed load)
        assert await store.take_load("m", "c", ttl_s=0.1) == (True, "c")
        # a loader that died loses it by TTL
        await until(lambda: store.take_load("m", "a", ttl_s=5), (True, "a"))
    finally:
        await store.close()


async def test_notices_reach_listeners(redis_url, redis_prefix):
    store = ClusterStore(redis_url, prefix=redis_prefix)
    heard: asyncio.Queue = asyncio.Queue()
    listener = asyncio.create_task(store.listen(heard.put_nowait))
    try:
        async def send_until_heard() -> dict:
            while True:  # the subscription starts asynchronously
                await store.notify("slots", "a", extra=1)
                with contextlib.suppress(TimeoutError):
                    return await asyncio.wait_for(heard.get(), 0.2)

        assert await asyncio.wait_for(send_until_heard(), 10) == {
            "kind": "slots", "host": "a", "extra": 1}
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        await store.close()


async def test_the_notice_listener_ends_when_told_without_a_cancel(redis_url, redis_prefix):
    """Its stop flag, not only a cancel (which can be lost in the client), ends it."""
    store = ClusterStore(redis_url, prefix=redis_prefix)
    heard: asyncio.Queue = asyncio.Queue()
    until = asyncio.Event()
    listener = asyncio.create_task(store.listen(heard.put_nowait, until=until))
    try:
        async def send_until_heard() -> dict:
            while True:
                await store.notify("slots", "a")
                with contextlib.suppress(TimeoutError):
                    return await asyncio.wait_for(heard.get(), 0.2)

        await asyncio.wait_for(send_until_heard(), 10)
        until.set()
        await asyncio.wait_for(asyncio.shield(listener), LISTEN_POLL_S + 2)
        assert listener.done() and not listener.cancelled()
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        await store.close()
