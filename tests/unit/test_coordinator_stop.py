"""A stop always reaches the workers and the leases: a phase before them that hangs or fails
(the catalog watcher, the cluster, the jobs) is left behind with its place logged, and the
models are still stopped and their leases released."""

from __future__ import annotations

import asyncio
import logging
import time

from model_boss import coordinator as coordinator_module
from model_boss.scheduling.queue import QueuedRequest

from .fakes import coordinator, manifest


async def _loaded(coord) -> None:
    ticket = await asyncio.wait_for(coord.queue.acquire(QueuedRequest("a", priority=5)), 5)
    ticket.release()
    assert await coord.boss.store.list()  # the model's lease


async def test_a_hung_phase_is_left_behind_and_the_workers_still_stop(tmp_path, monkeypatch,
                                                                      caplog):
    monkeypatch.setattr(coordinator_module, "STOP_PHASE_S", 0.3)
    coord, log = coordinator(tmp_path, [manifest("a", vram_mb=1000)])
    await coord.start()
    await _loaded(coord)
    watcher_stop = coord.live.stop

    async def never_ending_watcher_stop() -> None:
        await watcher_stop()
        await asyncio.Event().wait()

    monkeypatch.setattr(coord.live, "stop", never_ending_watcher_stop)
    stopped: list[dict] = []
    coord.events.listen(lambda event: stopped.append(event)
                           if event["type"] == "stopped" else None)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="model_boss.coordinator"):
        await asyncio.wait_for(coord.stop(), 5)
    assert time.monotonic() - started < 3
    warning = next(r.getMessage() for r in caplog.records
                   if "the catalog watcher" in r.getMessage())
    assert "took over 0.3s" in warning and "never_ending_watcher_stop" in warning, warning
    assert ("stop", "a") in log  # the fake worker was stopped
    assert await coord.boss.store.list() == []  # and its lease released
    assert stopped


async def test_a_failed_phase_is_logged_and_the_workers_still_stop(tmp_path, monkeypatch,
                                                                   caplog):
    coord, log = coordinator(tmp_path, [manifest("a", vram_mb=1000)])
    await coord.start()
    await _loaded(coord)
    jobs_shutdown = coord.jobs.shutdown

    async def failing_jobs_shutdown() -> None:
        await jobs_shutdown()
        raise ConnectionError("the job store went away")

    monkeypatch.setattr(coord.jobs, "shutdown", failing_jobs_shutdown)
    with caplog.at_level(logging.ERROR, logger="model_boss.coordinator"):
        await asyncio.wait_for(coord.stop(), 5)
    failed = next(r for r in caplog.records if "stopping the jobs failed" in r.getMessage())
    assert "the job store went away" in str(failed.exc_info[1])
    assert ("stop", "a") in log
    assert await coord.boss.store.list() == []
