"""A caller that goes away: the error it becomes, and the race that notices it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

from ..errors import ModelBossError

T = TypeVar("T")


class ClientDisconnected(ModelBossError):
    """The caller stopped waiting; nobody reads the answer (499, as nginx logs it)."""

    status_code = 499
    error_type = "invalid_request_error"
    code = "client_disconnected"


class Departure(asyncio.Event):
    """Set when the caller goes away. Setting it also cancels every task awaiting work under
    :func:`unless_disconnected` with it, so that guard costs no task and no race of its own
    (each request awaits two such works: its turn, then its answer)."""

    def __init__(self) -> None:
        super().__init__()
        self._guarded: set[asyncio.Task[Any]] = set()
        self.cancelled: set[asyncio.Task[Any]] = set()

    def set(self) -> None:
        if self.is_set():
            return
        super().set()
        for task in self._guarded:
            self.cancelled.add(task)
            task.cancel()


async def unless_disconnected(disconnected: Departure | None, work: Awaitable[T]) -> T:
    """Await ``work``; if ``disconnected`` is set first, cancel the work and raise
    :class:`ClientDisconnected`. With none (a background job) just await it."""
    if disconnected is None:
        return await work
    if disconnected.is_set():
        if isinstance(work, Coroutine):
            work.close()
        raise ClientDisconnected("client disconnected")
    task = asyncio.current_task()
    assert task is not None
    if task in disconnected._guarded:  # an outer guard of the same task answers for it
        return await work
    disconnected._guarded.add(task)
    try:
        result = await work
    except asyncio.CancelledError:
        if task in disconnected.cancelled and task.uncancel() == 0:
            raise ClientDisconnected("client disconnected") from None
        raise
    finally:
        disconnected._guarded.discard(task)
    if task in disconnected.cancelled:  # the work swallowed its cancellation
        task.uncancel()
        raise ClientDisconnected("client disconnected")
    return result

