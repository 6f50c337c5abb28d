"""Serving one request: route, queue, forward to the worker, pass the answer through.

A task's ladder is tried in the router's order; when a candidate cannot load (missing file,
crash, timeout, no room ever) the next one is tried within the request's budget, and a
``fallback`` event is logged. Every response names the model that served it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from ..coordinator import Coordinator
from ..errors import (
    BudgetExceeded,
    CapacityExceeded,
    LoadFailed,
    ModelBossError,
    ModelUnavailable,
    WorkerCrashed,
)
from ..inference import QueuedRequest, SlotTicket
from ..inference.backend import UpstreamResponse
from ..inference.templates import (
    completion_body,
    completion_stream_to_chat,
    completion_to_chat,
    render_prompt,
    uses_prompt_template,
)
from .errors import sse_error
from .requests import ClientDisconnected, Extensions, unless_disconnected

log = logging.getLogger(__name__)

MODEL_HEADER = "x-model-boss-model"
# Failures that say "this candidate cannot serve now", so the next rung is worth a try.
FALLBACK_ERRORS = (LoadFailed, ModelUnavailable, WorkerCrashed, CapacityExceeded)


def coordinator_of(request: Request) -> Coordinator:
    return request.app.state.coordinator


async def serve(coord: Coordinator, endpoint: str, body: dict[str, Any], ext: Extensions, *,
                request: Request | None = None,
                on_dispatch: Callable[[SlotTicket], None] | None = None) -> Response:
    """Route ``body`` and serve it. ``request`` (the client connection) lets a disconnect
    cancel the work; ``on_dispatch`` is told when a slot has been granted (jobs use it)."""
    settings = coord.settings
    client_id = ext.client_id or "anonymous"
    profile = settings.clients.get(client_id)
    priority = ext.priority
    if priority is None and profile and profile.priority is not None:
        priority = profile.priority
    plan = await coord.router.resolve(body.get("model"), task=ext.task,
                                      priority=priority if priority is not None
                                      else settings.default_priority, profile=profile)
    task = plan.task
    if task is not None:
        # task params are defaults: the request's own values win, an explicit null does not
        body = {**task.params, **{k: v for k, v in body.items() if v is not None}}
        if priority is None:
            priority = task.priority
    budget_s = ext.budget_s if ext.budget_s is not None else (task.budget_s if task else None)
    keep_alive = ext.keep_alive_s
    if keep_alive is None and task is not None:
        keep_alive = task.keep_alive_s
    started = time.monotonic()
    last_error: ModelBossError | None = None
    for position, model_id in enumerate(plan.candidates):
        remaining = None if budget_s is None else budget_s - (time.monotonic() - started)
        if remaining is not None and remaining <= 0:
            raise BudgetExceeded(f"budget of {budget_s:g}s ran out after trying "
                                 f"{', '.join(plan.candidates[:position])}",
                                 retry_after_s=max(1.0, budget_s))
        manifest = coord.catalog.get(model_id).manifest
        queued = QueuedRequest(
            model_id=model_id, client_id=client_id, endpoint=endpoint, budget_s=remaining,
            priority=priority if priority is not None else (
                manifest.priority if manifest.priority is not None
                else settings.default_priority),
            keep_alive_s=keep_alive,
            max_concurrency=profile.max_concurrency if profile else None)
        try:
            return await _serve_on(request, coord, queued, dict(body, model=model_id), ext,
                                   on_dispatch)
        except FALLBACK_ERRORS as exc:
            last_error = exc
            if position + 1 >= len(plan.candidates):
                raise
            coord.events.emit("fallback", model=model_id, to=plan.candidates[position + 1],
                              task=task.name if task else None, error=exc.message)
    raise last_error or ModelUnavailable("no candidate could serve the request")


async def _serve_on(request: Request | None, coord: Coordinator, queued: QueuedRequest,
                    body: dict[str, Any], ext: Extensions,
                    on_dispatch: Callable[[SlotTicket], None] | None) -> Response:
    entry = coord.catalog.get_available(queued.model_id)
    manifest = entry.manifest
    try:
        ticket: SlotTicket = await unless_disconnected(request, coord.queue.acquire(queued))
    except ClientDisconnected:
        return Response(status_code=499)
    headers = {MODEL_HEADER: manifest.id, "x-model-boss-queue-wait-s": str(ticket.waited_s)}
    if on_dispatch is not None:
        on_dispatch(ticket)
    stream = bool(body.get("stream"))
    endpoint = queued.endpoint
    thinking = ext.thinking if ext.thinking is not None else manifest.thinking
    templated = endpoint == "/v1/chat/completions" and uses_prompt_template(
        manifest.chat_template)
    if templated:
        prompt = render_prompt(manifest.chat_template or "", body.get("messages", []), thinking,
                               base_dir=_manifest_dir(manifest.source_file))
        body, endpoint = completion_body(body, prompt, manifest.chat_template or ""), \
            "/v1/completions"
    elif thinking is not None and endpoint == "/v1/chat/completions":
        kwargs = dict(body.get("chat_template_kwargs") or {})
        kwargs.setdefault("enable_thinking", thinking)
        body["chat_template_kwargs"] = kwargs
    backend = ticket.slot.backend
    try:
        if backend is None:
            raise WorkerCrashed(f"'{manifest.id}' lost its worker before the request ran")
        upstream: UpstreamResponse = await unless_disconnected(
            request, backend.handle_request(endpoint, body, stream))
    except ClientDisconnected:
        ticket.release(ok=False, client_fault=True)
        return Response(status_code=499)
    except BaseException as exc:
        ticket.release(ok=False, client_fault=_client_fault(exc))
        raise
    media_type = upstream.headers.get("content-type", "application/json")
    if upstream.stream is None:
        ticket.release(ok=True)
        content = upstream.body
        if templated:
            content = orjson.dumps(completion_to_chat(orjson.loads(content or b"{}")))
        return Response(content, status_code=upstream.status, headers=headers,
                        media_type=media_type)
    chunks = upstream.stream
    if templated:
        chunks = completion_stream_to_chat(chunks)
    return StreamingResponse(_relay(chunks, ticket, manifest.id), status_code=upstream.status,
                             headers=headers, media_type="text/event-stream")


def _manifest_dir(source_file: str | None):
    from pathlib import Path

    return Path(source_file).parent if source_file else None


def _client_fault(exc: BaseException) -> bool:
    return isinstance(exc, ModelBossError) and 400 <= exc.status_code < 500


async def _relay(chunks: AsyncIterator[bytes], ticket: SlotTicket,
                 model_id: str) -> AsyncIterator[bytes]:
    """Pass chunks through untouched; a failure mid-stream becomes an SSE error + [DONE]."""
    ok = False
    try:
        async for chunk in chunks:
            yield chunk
        ok = True
    except ModelBossError as exc:
        log.warning("stream from %s failed: %s", model_id, exc.message)
        yield sse_error(exc)
        yield b"data: [DONE]\n\n"
    except Exception as exc:
        log.exception("stream from %s failed", model_id)
        yield sse_error(exc)
        yield b"data: [DONE]\n\n"
    finally:
        with contextlib.suppress(Exception):
            await chunks.aclose()  # type: ignore[attr-defined]
        ticket.release(ok=ok)
