"""A caller that goes away: the error it becomes, and the race that notices it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from ..errors import ModelBossError

T = TypeVar("T")


class ClientDisconnected(ModelBossError):
    """The caller stopped waiting; nobody reads the answer (499, as nginx logs it)."""

    status_code = 499
    error_type = "invalid_request_error"
    code = "client_disconnected"


async def unless_disconnected(disconnected: asyncio.Event | None, work: Awaitable[T]) -> T:
    """Await ``work``; if ``disconnected`` is set first, cancel the work and raise
    :class:`ClientDisconnected`. With no event (a background job) just await it."""
    if disconnected is None:
        return await work
    job = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(disconnected.wait())
    try:
        done, _ = await asyncio.wait({job, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        job.cancel()
        gone.cancel()
        raise
    if job in done:
        gone.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gone
        return job.result()
    job.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await job
    raise ClientDisconnected("client disconnected")
