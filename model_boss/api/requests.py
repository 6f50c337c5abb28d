"""Reading a client request: size limit, JSON, ``x_*`` extensions, headers, disconnects."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from fastapi import Request

from ..errors import BadRequest, ModelBossError, PayloadTooLarge

T = TypeVar("T")


class ClientDisconnected(ModelBossError):
    status_code = 499
    code = "client_disconnected"


@dataclass(slots=True)
class Extensions:
    """The ``x_*`` fields (and their headers) model-boss reads and strips before forwarding."""

    client_id: str | None = None
    priority: int | None = None
    budget_s: float | None = None
    keep_alive_s: float | None = None
    task: str | None = None
    thinking: bool | None = None
    extra: dict[str, Any] | None = None


async def read_json_body(request: Request, max_bytes: int) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"request body of {declared} bytes is over the {max_bytes} limit")
    raw = await request.body()
    if len(raw) > max_bytes:
        raise PayloadTooLarge(f"request body of {len(raw)} bytes is over the {max_bytes} limit")
    if not raw:
        raise BadRequest("request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def _number(value: Any, name: str, *, integer: bool = False, low: float | None = None,
            high: float | None = None) -> float | int:
    if isinstance(value, bool) or value is None:
        raise BadRequest(f"{name} must be a number", param=name)
    try:
        number = int(value) if integer else float(value)
        if integer and float(value) != number:
            raise ValueError
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"{name} must be {'an integer' if integer else 'a number'}",
                         param=name) from exc
    if (low is not None and number < low) or (high is not None and number > high):
        raise BadRequest(f"{name} must be between {low:g} and {high:g}", param=name)
    return number


def pop_extensions(body: dict[str, Any], headers: Mapping[str, str]) -> Extensions:
    """Remove every ``x_*`` key from ``body`` and return the ones we understand; the
    ``X-Client-Id`` / ``X-Priority`` headers fill in what the body does not say."""
    found = {key: body.pop(key) for key in [k for k in body if k.startswith("x_")]}
    ext = Extensions()
    client = found.pop("x_client_id", None) or headers.get("x-client-id")
    if client is not None:
        if not isinstance(client, str) or not client or len(client) > 200:
            raise BadRequest("x_client_id must be a non-empty string", param="x_client_id")
        ext.client_id = client
    priority = found.pop("x_priority", None)
    if priority is None:
        priority = headers.get("x-priority")
    if priority is not None:
        ext.priority = int(_number(priority, "x_priority", integer=True, low=0, high=100))
    if (budget := found.pop("x_budget_s", None)) is not None:
        ext.budget_s = float(_number(budget, "x_budget_s", low=0.001, high=86400))
    if (keep := found.pop("x_keep_alive_s", None)) is not None:
        ext.keep_alive_s = float(_number(keep, "x_keep_alive_s", low=-1, high=30 * 86400))
    if (task := found.pop("x_task", None)) is not None:
        if not isinstance(task, str) or not task:
            raise BadRequest("x_task must be a non-empty string", param="x_task")
        ext.task = task
    if (thinking := found.pop("x_thinking", None)) is not None:
        if not isinstance(thinking, bool):
            raise BadRequest("x_thinking must be true or false", param="x_thinking")
        ext.thinking = thinking
    ext.extra = found
    return ext


async def _until_disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request | None, work: Awaitable[T]) -> T:
    """Await ``work``; if the client goes away first, cancel it and raise ClientDisconnected.
    With no client connection (a background job) just await it."""
    if request is None:
        return await work
    job = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnected(request))
    try:
        done, _ = await asyncio.wait({job, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        job.cancel()
        watch.cancel()
        raise
    if job in done:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        return job.result()
    job.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await job
    raise ClientDisconnected("client disconnected")


@contextlib.asynccontextmanager
async def cancelled_on_disconnect(request: Request):
    """Run the block; if the client disconnects first, the block is cancelled and
    :class:`ClientDisconnected` is raised instead. One watcher task per request."""
    task = asyncio.current_task()
    gone = asyncio.Event()

    def disconnected(watch: asyncio.Task) -> None:
        if not watch.cancelled() and watch.exception() is None:
            gone.set()
            if task is not None:
                task.cancel()

    watch = asyncio.create_task(_until_disconnected(request))
    watch.add_done_callback(disconnected)
    try:
        yield
    except asyncio.CancelledError:
        if not gone.is_set():
            raise
        if task is not None:
            task.uncancel()
        raise ClientDisconnected("client disconnected") from None
    finally:
        watch.remove_done_callback(disconnected)
        watch.cancel()


def parse_json(raw: bytes) -> Any:
    return orjson.loads(raw)
