"""Preload entries: a plain id loads at startup and then keeps the model's stay-warm like any
model; an entry with ``keep_alive_s: -1`` stays until evicted for room, one with ``pin`` for
good; a misspelt field is a config error naming it."""

from __future__ import annotations

import asyncio
import time

import pytest
from pydantic import ValidationError

from model_boss.scheduling.queue import QueuedRequest
from model_boss.settings import Settings

from .fakes import coordinator, manifest


async def test_preload_entries_stay_as_they_say(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest(m, vram_mb=1000) for m in "abc"],
                           preload=[{"model": "a", "keep_alive_s": -1},
                                    {"model": "b", "pin": True}, "c"])
    await coord.start()
    try:
        slots = coord.pool.slots
        for _ in range(200):
            if all(m in slots and slots[m].state == "ready" for m in "abc"):
                break
            await asyncio.sleep(0.02)
        assert {m: str(slots[m].state) for m in "abc"} == dict.fromkeys("abc", "ready")
        later = time.time() + 10_000  # far past every stay-warm
        assert slots["a"].unload_at is None and not slots["a"].pinned
        assert slots["b"].pinned and not slots["b"].expired(later)
        assert slots["c"].unload_at is not None and slots["c"].expired(later)
        # a request with no keep-alive of its own leaves the preload's stay as it was
        ticket = await asyncio.wait_for(coord.queue.acquire(QueuedRequest("a", priority=5)), 5)
        ticket.release()
        assert slots["a"].unload_at is None and not slots["a"].expired(later)
    finally:
        await coord.stop()


def test_a_misspelt_preload_field_is_a_config_error(tmp_path):
    with pytest.raises(ValidationError, match=r"preload\.0\.keep_alive"):
        Settings(preload=[{"model": "a", "keep_alive": -1}], state_dir=tmp_path)
