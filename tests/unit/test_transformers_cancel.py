"""The transformers worker's cancel by request id, without a model: the ticket book (a cancel
before its request, after it, or for every open one) and the batcher (a cancelled embedding or
rerank request still queued leaves the queue and never runs)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from workers.transformers.batcher import Batcher
from workers.transformers.cancel import Cancelled, Tickets
from workers.transformers.errors import WorkerError


def test_a_cancel_reaches_an_open_ticket_and_is_counted_once_closed():
    book = Tickets()
    ticket = book.open("a")
    assert book.running() == ["a"] and not ticket.cancelled
    assert book.cancel("a")["outcome"] == "cancelling"
    with pytest.raises(Cancelled):
        ticket.check()
    book.close(ticket, stopped=True)
    assert (book.running(), book.cancelled, book.last_cancelled) == ([], 1, "a")
    assert book.cancel("a")["outcome"] == "finished"  # over: nothing to do


def test_a_cancel_that_overtakes_its_request_refuses_it_and_only_it():
    book = Tickets()
    assert book.cancel("early")["outcome"] == "remembered"
    assert book.open("early").cancelled
    assert not book.open("other").cancelled
    assert not book.open(None).cancelled  # a fresh id


def test_no_id_cancels_every_open_request_and_a_duplicate_id_is_refused():
    book = Tickets()
    one, two = book.open("1"), book.open("2")
    assert sorted(book.cancel(None)["cancelled"]) == ["1", "2"]
    assert one.cancelled and two.cancelled
    with pytest.raises(WorkerError) as refused:
        book.open("1")
    assert (refused.value.status, refused.value.code) == (409, "duplicate_request_id")


async def test_a_queued_request_cancelled_leaves_the_batcher_without_running():
    ran: list[list[str]] = []
    release = threading.Event()

    def run(items: list[str]) -> list[str]:
        if not ran:
            release.wait(5)  # the first batch runs until the test lets it go
        ran.append(list(items))
        return [item.upper() for item in items]

    batcher = Batcher(run, batch_size=4, max_wait_s=0.0)
    batcher.start()
    book = Tickets()
    try:
        first = asyncio.create_task(batcher.submit(["a"], book.open("first")))
        await asyncio.sleep(0.1)  # running, holding the model
        doomed_ticket = book.open("doomed")
        doomed = asyncio.create_task(batcher.submit(["b", "c"], doomed_ticket))
        kept = asyncio.create_task(batcher.submit(["d"], book.open("kept")))
        await asyncio.sleep(0.05)
        book.cancel("doomed")
        with pytest.raises(Cancelled):
            await doomed
        release.set()
        assert await first == ["A"] and await kept == ["D"]
    finally:
        release.set()
        await batcher.stop()
    assert ran == [["a"], ["d"]]  # the cancelled request's items never reached the model


async def test_a_request_cancelled_while_its_batch_runs_gets_cancelled_not_its_results():
    release = threading.Event()

    def run(items: list[str]) -> list[str]:
        release.wait(5)
        return items

    batcher = Batcher(run, batch_size=4, max_wait_s=0.0)
    batcher.start()
    try:
        ticket = Tickets().open("x")
        task = asyncio.create_task(batcher.submit(["a"], ticket))
        await asyncio.sleep(0.1)
        ticket.cancel()
        release.set()
        with pytest.raises(Cancelled):
            await task
    finally:
        release.set()
        await batcher.stop()
