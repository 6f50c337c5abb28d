"""Dynamic batching: the items of requests that arrive together run as one batch.

A request's items are queued whole; the runner takes queued requests until it holds
``batch_size`` items or the first has waited ``max_wait_s``, runs them in one call (in a
thread, one batch at a time: the model is not called concurrently), and hands each request
its own slice of the results. 32 clients sending one sentence each cost one batch of 32.
Requests that come already gathered (``POST /batch``: the coordinator did the waiting) do not
wait for more: they run with whatever is queued beside them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..tickets import Ticket
from .cancel import Cancelled

# set by a route whose requests come gathered: their asks do not wait for more
GATHERED: contextvars.ContextVar[bool] = contextvars.ContextVar("gathered", default=False)


@dataclass(slots=True)
class _Ask:
    items: Sequence[Any]
    done: asyncio.Future
    queued_at: float = field(default_factory=time.monotonic)  # a gathered one's: moved back
    arrived_at: float = field(default_factory=time.monotonic)
    batch: dict[str, Any] = field(default_factory=dict)  # the batch it ran in (BATCH_FIGURES)


# what a request is told of the batch it ran in: the items and requests in it, the request's
# wait in the queue before it ran, and how long it ran (milliseconds)
BATCH_FIGURES = ("batch_size", "batch_requests", "batch_wait_ms", "batch_ms")


class Batcher:
    def __init__(self, run: Callable[[list[Any]], Sequence[Any]], batch_size: int,
                 max_wait_s: float) -> None:
        self.run = run
        self.batch_size = batch_size
        self.max_wait_s = max_wait_s
        self.batches = 0
        self.largest = 0
        self._queue: asyncio.Queue[_Ask] = asyncio.Queue()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def submit(self, items: Sequence[Any], ticket: Ticket | None = None) -> list[Any]:
        """Results for ``items``, in their order. A cancel of ``ticket`` takes the request out
        of the queue (it never runs); in a batch already running, its share is dropped."""
        results, _batch = await self.answer(items, ticket)
        return results

    async def answer(self, items: Sequence[Any], ticket: Ticket | None = None,
                     ) -> tuple[list[Any], dict[str, Any]]:
        """:meth:`submit`'s results, and the figures of the batch they ran in
        (:data:`BATCH_FIGURES`)."""
        ask = _Ask(items, asyncio.get_running_loop().create_future())
        if GATHERED.get():  # its wait is over: it runs with what is queued now
            ask.queued_at -= self.max_wait_s
        if ticket is not None:
            ticket.on_cancel(lambda: ask.done.done() or ask.done.set_exception(
                Cancelled(ticket.request_id)))
        await self._queue.put(ask)
        return await ask.done, ask.batch

    async def _gather(self) -> list[_Ask]:
        asks = [await self._queue.get()]
        while asks[0].done.done():  # cancelled (or its caller gone) while it waited
            asks = [await self._queue.get()]
        count = len(asks[0].items)
        deadline = asks[0].queued_at + self.max_wait_s
        while count < self.batch_size:
            try:
                ask = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    ask = await asyncio.wait_for(self._queue.get(), left)
                except TimeoutError:
                    # the wait's end yields to the loop, where requests that came in time are
                    # queued: they join (a get_nowait above), the deadline then ends the batch
                    continue
            if not ask.done.done():
                asks.append(ask)
                count += len(ask.items)
        return [a for a in asks if not a.done.done()]  # a caller that went away is dropped

    async def _loop(self) -> None:
        while True:
            asks = await self._gather()
            if not asks:
                continue
            items = [item for ask in asks for item in ask.items]
            self.batches += 1
            self.largest = max(self.largest, len(items))
            began = time.monotonic()
            try:
                results = await asyncio.to_thread(self.run, items)
            except Exception as exc:
                for ask in asks:
                    if not ask.done.done():
                        ask.done.set_exception(exc)
                continue
            ran_ms = round((time.monotonic() - began) * 1000, 3)
            start = 0
            for ask in asks:
                end = start + len(ask.items)
                if not ask.done.done():
                    ask.batch.update(zip(BATCH_FIGURES, (
                        len(items), len(asks), round((began - ask.arrived_at) * 1000, 3),
                        ran_ms), strict=True))
                    ask.done.set_result(list(results[start:end]))
                start = end
