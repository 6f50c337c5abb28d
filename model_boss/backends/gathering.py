"""Gathering: embedding and rerank requests that reach one worker together go to it as one
exchange.

Each request has been granted its slot as any other (its own ticket, held until its answer
comes back); only the trip to the worker is shared. A request joins the open gathering of its
route; the gathering is sent (``POST /batch``, workers/transformers/parts.py) once it holds
``batch_size`` items, once ``quiet_s`` passes with no request joining, or ``longest_s`` after
its first request, whichever comes first. The worker runs the parts as one batch at once, and
each request gets its own answer (or its own error) back.

Why here and not only in the worker's batcher: a small request's HTTP handling costs both
processes more CPU than its share of the model, and on a machine whose cores also run the
model that cost is taken from it. Waiting for a quiet moment rather than a fixed time keeps a
burst in one batch: 32 requests that arrive over 30 ms run as one batch of 32, not as a small
batch that slows the arrival of the rest, then another.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .base import UpstreamResponse

# the coordinator's endpoint → how many items (texts, documents) a body holds
GATHERED: dict[str, Callable[[dict[str, Any]], int]] = {
    "/v1/embeddings": lambda body: _count(body.get("input")),
    "/v1/rerank": lambda body: _count(body.get("documents")),
}
Send = Callable[[str, list[dict[str, Any]]], Awaitable[list[UpstreamResponse | Exception]]]


def _count(value: Any) -> int:
    return len(value) if isinstance(value, list) else 1


@dataclass(slots=True)
class _Part:
    body: dict[str, Any]
    answer: asyncio.Future


@dataclass(slots=True)
class _Open:
    """A route's gathering not sent yet."""

    first_at: float
    parts: list[_Part] = field(default_factory=list)
    items: int = 0
    timer: asyncio.TimerHandle | None = None


class Gathering:
    """One worker's open gatherings, by route. ``send(path, bodies)`` makes the exchange and
    gives one answer or error per body, in order."""

    def __init__(self, send: Send, batch_size: int, quiet_s: float, longest_s: float) -> None:
        self.send = send
        self.batch_size = max(1, batch_size)
        self.quiet_s = quiet_s
        self.longest_s = max(longest_s, quiet_s)
        self.sent = 0  # exchanges made (for tests and the benchmark)
        self._open: dict[str, _Open] = {}
        self._sending: set[asyncio.Task] = set()

    async def submit(self, path: str, body: dict[str, Any], items: int) -> UpstreamResponse:
        """``body``'s answer, sent with whatever joins it. A caller that goes away before its
        gathering is sent leaves it (it is never sent); after, its answer is dropped."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        gathering = self._open.get(path)
        if gathering is None:
            gathering = self._open[path] = _Open(first_at=now)
        part = _Part(body, loop.create_future())
        gathering.parts.append(part)
        gathering.items += items
        if gathering.items >= self.batch_size:
            self._close(path)
        else:
            if gathering.timer is not None:
                gathering.timer.cancel()
            at = min(now + self.quiet_s, gathering.first_at + self.longest_s)
            gathering.timer = loop.call_at(at, self._close, path)
        try:
            return await part.answer
        except asyncio.CancelledError:
            self._leave(path, gathering, part, items)
            raise

    def _leave(self, path: str, gathering: _Open, part: _Part, items: int) -> None:
        if self._open.get(path) is not gathering or part not in gathering.parts:
            return  # already sent
        gathering.parts.remove(part)
        gathering.items -= items
        if not gathering.parts:
            if gathering.timer is not None:
                gathering.timer.cancel()
            del self._open[path]

    def _close(self, path: str) -> None:
        gathering = self._open.pop(path, None)
        if gathering is None:
            return
        if gathering.timer is not None:
            gathering.timer.cancel()
        task = asyncio.get_running_loop().create_task(self._exchange(path, gathering.parts))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _exchange(self, path: str, parts: list[_Part]) -> None:
        self.sent += 1
        try:
            answers = await self.send(path, [part.body for part in parts])
        except Exception as exc:  # the worker failed the whole exchange: each part hears it
            answers = [copy.copy(exc) for _ in parts]
        except BaseException:  # cancelled (shutting down): each part is too
            for part in parts:
                part.answer.cancel()
            raise
        for part, answer in zip(parts, answers, strict=True):
            if part.answer.done():  # its caller went away
                continue
            if isinstance(answer, BaseException):
                part.answer.set_exception(answer)
            else:
                part.answer.set_result(answer)
