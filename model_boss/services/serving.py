"""Serving one request: route, queue, forward to the worker, pass the answer through.

Transport-neutral: it takes a parsed body and its extensions and returns a :class:`Served`
(a whole body, or a chunk stream that reports a failure as an SSE error event then
``[DONE]``). A task's ladder is tried in the router's order; when a candidate cannot serve
(missing file, crash, timeout, no room ever) the next one is tried within the request's
budget, and a ``fallback`` event is logged; a rung that cannot serve this kind of request
(an embedder for a chat) is passed over with a ``rung_skipped`` event that says why.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from ..backends.registry import BACKENDS
from ..catalog import BackendKind, Category, ModelManifest, media_refusal
from ..endpoints import CHAT, COMPLETIONS
from ..errors import (
    BadRequest,
    BudgetExceeded,
    CapacityExceeded,
    Forbidden,
    LoadFailed,
    ModelBossError,
    ModelNotFound,
    ModelUnavailable,
    WorkerCrashed,
)
from ..jobs.runner import Dispatched
from ..scheduling.replicas import cached_prefix_tokens, prompt_blocks, session_of
from ..scheduling.request import QueuedRequest, SlotTicket, asked_work
from ..scheduling.request_log import prompt_text
from ..tenancy.keys import floored_priority
from . import request_trace
from .accounting import Who, read_figures, unserved_row, who
from .cancel import Departure, unless_disconnected
from .clustered import serve_clustered
from .extensions import Extensions
from .native import PROPS, worker_props
from .redact import redacted
from .served import (
    CACHED_PREFIX_HEADER,
    MODEL_HEADER,
    REPLICA_HEADER,
    WAIT_HEADER,
    Dialect,
    Served,
    WorkerCall,
    openai_stream_end,
    tokens_in,
)
from .stream_life import slot_stream
from .validation import blind, too_many_choices

if TYPE_CHECKING:
    from ..catalog.tasks import TaskSpec
    from ..coordinator import Coordinator
    from ..scheduling.router import RoutePlan
    from ..settings import ClientProfile, Settings

log = logging.getLogger(__name__)

# Failures that say "this candidate cannot serve now", so the next rung is worth a try.
FALLBACK_ERRORS = (LoadFailed, ModelUnavailable, WorkerCrashed, CapacityExceeded)
CHOICE_ENDPOINTS = (CHAT, COMPLETIONS)
# not a worker route: the model is made READY through the queue, nothing is sent to it
LOAD_ONLY = "load"

async def serve(coord: Coordinator, endpoint: str, body: dict[str, Any], ext: Extensions, *,
                disconnected: Departure | None = None,
                on_dispatch: Dispatched | None = None, dialect: Dialect | None = None) -> Served:
    """Route ``body`` and serve it. ``disconnected`` (set when the caller goes away) cancels
    the work; ``on_dispatch`` is told when a slot has been granted (jobs use it); ``dialect``
    speaks the route's API to the worker that serves it (else the body goes as it came).
    Every error leaves with its message redacted (no worker traceback, file path or
    address)."""
    try:
        return await _serve(coord, endpoint, body, ext, disconnected, on_dispatch, dialect)
    except ModelBossError as exc:
        redacted(exc)
        raise


async def admit(coord: Coordinator, endpoint: str, body: dict[str, Any],
                ext: Extensions) -> None:
    """Raise now what :func:`serve` would refuse before it queues (an unknown model or task,
    a forbidden model, every candidate passed over): the same errors from the same checks,
    nothing queued or loaded. A job is checked so before it is taken."""
    try:
        plan, _, body = await _route(coord, body, ext)
        refusals = [_refusal(coord, model_id, endpoint, body) for model_id in plan.candidates]
        if all(refusals):  # every candidate passed over (the last one's error), or none
            raise next(reversed(refusals), None) or ModelUnavailable(
                "no candidate could serve the request")
    except ModelBossError as exc:
        redacted(exc)
        raise


async def _route(coord: Coordinator, body: dict[str, Any], ext: Extensions,
                 ) -> tuple[RoutePlan, Who, dict[str, Any]]:
    """The request's plan, who it is, its body with its task's params; a model outside a
    key's scope is not found, as if it did not exist."""
    asker = who(coord, ext, body)
    profile = asker.profile
    task_name = ext.task
    if task_name is None and not body.get("model") and not (profile and profile.default_task):
        task_name = default_task(coord)
    try:
        plan = await coord.router.resolve(
            body.get("model"), task=task_name, profile=profile,
            priority=effective_priority(coord.settings, ext.priority, profile))
    except Forbidden as exc:
        if not asker.keyed:
            raise
        name = body.get("model") or task_name
        raise ModelNotFound(f"The model '{name}' does not exist", param="model") from exc
    if plan.task is not None:  # defaults: the request's own values win, a null does not
        body = {**plan.task.params, **{k: v for k, v in body.items() if v is not None}}
    return plan, asker, body


def _refusal(coord: Coordinator, model_id: str, endpoint: str,
             body: dict[str, Any]) -> ModelBossError | None:
    """Why ``model_id`` cannot be given ``body`` on ``endpoint`` (a rung passed over)."""
    found = coord.catalog.find(model_id)
    if found is None:  # removed by a reload since the route was chosen: the next rung
        return ModelNotFound(f"The model '{model_id}' does not exist", param="model")
    manifest = found.manifest
    return _wrong_kind(coord, manifest, endpoint) \
        or _not_turned_on(coord, manifest, endpoint) or blind(manifest, endpoint, body) \
        or too_many_choices(manifest, endpoint, body) \
        or media_refusal(manifest, found.path, found.ip_adapter, endpoint, body)


async def _serve(coord: Coordinator, endpoint: str, body: dict[str, Any], ext: Extensions,
                 disconnected: Departure | None, on_dispatch: Dispatched | None,
                 dialect: Dialect | None) -> Served:
    settings = coord.settings
    plan, asker, body = await _route(coord, body, ext)
    profile = asker.profile
    # each end user's under a key; a request that names none is the key's alone
    end_user_limits = profile.end_user_limits \
        if profile is not None and asker.keyed and asker.end_user else None
    refused = coord.end_users.admit(asker.key, asker.end_user, end_user_limits) \
        if end_user_limits is not None else None
    if refused is not None:
        coord.events.emit("key_refused", key=asker.key, end_user=asker.end_user,
                          code=refused.code, path=endpoint)
        raise refused
    task = plan.task
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
        refusal = _refusal(coord, model_id, endpoint, body)
        if refusal is not None:  # a rung that cannot give what was asked is passed over
            last_error = refusal
            coord.events.emit("rung_skipped", model=model_id, task=task.name if task else None,
                              rung=position, endpoint=endpoint, code=refusal.code,
                              reason=refusal.message)
            continue
        manifest = coord.catalog.get(model_id).manifest
        served_id, served_body = coord.catalog.served_on(model_id, body)  # an adapter: its base
        queued = QueuedRequest(
            model_id=served_id, client_id=asker.client_id, endpoint=endpoint,
            budget_s=remaining, budget_given_s=budget_s, key=asker.key,
            end_user=asker.end_user, work=asked_work(endpoint, body), keep_alive_s=keep_alive,
            priority=effective_priority(settings, ext.priority, profile, task, manifest),
            max_concurrency=profile.max_concurrency if profile else None,
            max_queued=profile.max_queued if profile else None,
            end_user_max_concurrency=end_user_limits.max_concurrency
            if end_user_limits else None,
            end_user_max_queued=end_user_limits.max_queued if end_user_limits else None,
            share=_share(profile, task), task=task and task.name, rung=task and position,
            prompt=prompt_text(body, settings.capture_prompts, settings.capture_prompt_chars),
            session=session_of(body, ext.session_id),
            prefix=prompt_blocks(body) if coord.catalog.get(served_id).manifest.replicas.max > 1
            or coord.cluster is not None else ())
        if ext.request_id:  # a job, or a stream that follows its place in the queue
            queued.request_id = ext.request_id
        try:
            return await _serve_on(coord, queued, dict(served_body, model=served_id), ext,
                                   disconnected, on_dispatch, dialect)
        except FALLBACK_ERRORS as exc:
            last_error = exc
            if position + 1 >= len(plan.candidates):
                raise
            coord.events.emit("fallback", model=model_id, to=plan.candidates[position + 1],
                              task=task.name if task else None, error=exc.message)
    raise last_error or ModelUnavailable("no candidate could serve the request")


def effective_priority(settings: Settings, asked: int | None, profile: ClientProfile | None,
                       task: TaskSpec | None = None,
                       manifest: ModelManifest | None = None) -> int:
    """The priority a request runs at: its own, else its client profile's, its task's, its
    model's, and last the default; never more important than its key's floor."""
    found = next((p for p in (asked, profile and profile.priority, task and task.priority,
                              manifest and manifest.priority) if p is not None),
                 settings.default_priority)
    return floored_priority(profile, found)


def _share(profile: ClientProfile | None, task: TaskSpec | None) -> float:
    """The client's fair-share weight: its profile's ``share``, else the task's, else 1."""
    if profile is not None and profile.share is not None:
        return profile.share
    return task.share if task is not None else 1.0


def default_task(coord: Coordinator) -> str:
    """The task a request that names no model goes to; a 400 that says how to set one."""
    name = coord.tasks.default_task
    if name is None:
        raise BadRequest("'model' is required: name a model (GET /v1/models lists them) or a "
                         "task ('task:<name>'), or name a default task with 'default_task: "
                         "<name>' at the top of tasks.yaml", param="model", code="missing_field")
    return name


def _wrong_kind(coord: Coordinator, manifest: ModelManifest,
                endpoint: str) -> BadRequest | None:
    """A worker kind that says which endpoints it serves (an embedder: /v1/embeddings), or
    which it refuses (llama.cpp: audio and images), is not loaded for another: the request is
    refused (or passed to the next rung) at once, naming the models that do serve it."""
    if manifest.category == Category.REALTIME:  # three models of its own, never loaded itself
        return BadRequest(f"'{manifest.id}' is a realtime pipeline; it serves /v1/realtime "
                          "only", param="model", code="unsupported_endpoint")
    backend = BACKENDS.get(manifest.backend)
    serves = getattr(backend, "serves", None)
    endpoints = serves(manifest) if serves is not None else None
    if endpoint in getattr(backend, "refuses", ()):
        served = f"it does not serve {endpoint}"
    elif endpoints is None or endpoint in endpoints:
        return None
    else:
        served = f"it serves {', '.join(endpoints) or 'nothing'}, not {endpoint}"
    others = [e.manifest.id for e in coord.catalog if e.available
              and endpoint in _listed(e.manifest)]
    return BadRequest(f"'{manifest.id}' is a model of kind '{manifest.category}'; {served}"
                      + (f"; models that do: {', '.join(others)}" if others else ""),
                      param="model", code="unsupported_endpoint")


def _listed(manifest: ModelManifest) -> list[str]:
    """The endpoints a model's kind names as its own (none for kinds that take anything)."""
    serves = getattr(BACKENDS.get(manifest.backend), "serves", None)
    return serves(manifest) if serves is not None else []


# what a llama.cpp model serves only when its manifest turns it on: endpoints, field, words
_TURNED_ON = ((frozenset({"/v1/embeddings", "/embeddings", "/embedding"}), "embeddings",
               "embeddings", Category.EMBEDDING),
              (frozenset({"/v1/rerank", "/rerank", "/v1/reranking", "/reranking"}), "reranking",
               "reranking", Category.RERANK))


def _not_turned_on(coord: Coordinator, manifest: ModelManifest,
                   endpoint: str) -> BadRequest | None:
    """Embeddings or reranking asked of a llama.cpp model whose manifest does not turn them
    on: a 400 that names the manifest field and the models that do serve it, before any load
    (llama.cpp itself would say "start it with --embeddings", a flag the user never sets)."""
    if manifest.backend != BackendKind.LLAMA_SERVER:
        return None
    for endpoints, field, words, category in _TURNED_ON:
        if endpoint in endpoints and not _serves(manifest, field, category):
            others = [e.manifest.id for e in coord.catalog
                      if e.available and _serves(e.manifest, field, category)]
            return BadRequest(
                f"'{manifest.id}' does not serve {words}: set `{field}: true` in its manifest "
                f"to turn them on" + (f"; models that do: {', '.join(others)}" if others
                                      else "; no model here serves them"),
                param="model", code="unsupported_endpoint")
    return None


def _serves(manifest: ModelManifest, field: str, category: Category) -> bool:
    if manifest.backend == BackendKind.LLAMA_SERVER:  # only with llama.cpp's flag
        return bool(getattr(manifest, field)) or f"--{field}" in manifest.args
    return manifest.category == category


def _think(body: dict[str, Any], endpoint: str, thinking: bool | None) -> None:
    """The thinking toggle, as OpenAI-compatible servers take it: a chat template kwarg
    (the request's own ``chat_template_kwargs`` win); llama.cpp's Responses API too."""
    if thinking is None or endpoint not in (CHAT, "/v1/responses"):
        return
    kwargs = dict(body.get("chat_template_kwargs") or {})
    kwargs.setdefault("enable_thinking", thinking)
    body["chat_template_kwargs"] = kwargs


async def _serve_on(coord: Coordinator, queued: QueuedRequest, body: dict[str, Any],
                    ext: Extensions, disconnected: Departure | None,
                    on_dispatch: Dispatched | None, dialect: Dialect | None) -> Served:
    if coord.cluster is None:
        return await _serve_here(coord, queued, body, ext, disconnected, on_dispatch, dialect)
    return await unless_disconnected(disconnected, serve_clustered(
        coord, queued, body, ext,
        lambda: _serve_here(coord, queued, body, ext, disconnected, on_dispatch, dialect),
        dialect.stream_end if dialect else openai_stream_end))


async def _serve_here(coord: Coordinator, queued: QueuedRequest, body: dict[str, Any],
                      ext: Extensions, disconnected: Departure | None,
                      on_dispatch: Dispatched | None, dialect: Dialect | None) -> Served:
    manifest = coord.catalog.get_available(queued.model_id).manifest
    traced = request_trace.begin(coord, queued)  # None: traces off, no span made
    waited = traced.waiting(coord.queue.depth) if traced is not None else None
    try:
        ticket: SlotTicket = await unless_disconnected(disconnected,
                                                       coord.queue.acquire(queued))
    except BaseException as exc:  # never granted: cancelled, refused or failed in the queue
        if traced is not None:
            traced.not_granted(waited, exc)
        coord.used(unserved_row(queued, exc, coord.queue.meter.member))
        raise
    if traced is not None:
        traced.granted(ticket, waited)
    headers = {MODEL_HEADER: manifest.id, WAIT_HEADER: str(ticket.waited_s)}
    if manifest.replicas.max > 1:
        headers[REPLICA_HEADER] = ticket.slot.key
        headers[CACHED_PREFIX_HEADER] = str(cached_prefix_tokens(ticket.route))
    if on_dispatch is not None:
        on_dispatch(ticket)
    backend = ticket.slot.backend
    if queued.endpoint == LOAD_ONLY:
        ticket.release(ok=True)
        return Served(200, headers, "application/json", body=b"{}")
    try:
        if backend is None:
            raise WorkerCrashed(f"'{manifest.id}' lost its worker before the request ran")
        call = (dialect.call(backend, manifest.id, queued.endpoint, body) if dialect
                else WorkerCall(queued.endpoint, body))
        ticket.settled += [call.settled] if call.settled else []
        _think(call.body, call.endpoint, ext.thinking if ext.thinking is not None
               else manifest.thinking)
        work = (worker_props(backend, manifest.id) if call.endpoint == PROPS
                else backend.handle_request(call.endpoint, call.body,
                                            bool(call.body.get("stream"))))
        with traced.calling(call.endpoint, manifest.id) if traced is not None \
                else request_trace.UNTRACED:
            upstream = await unless_disconnected(disconnected, work)
        if upstream.stream is not None and call.gather is not None:  # a stream taken whole
            upstream = await unless_disconnected(disconnected, call.gather(upstream))
    except BaseException as exc:
        ticket.release(ok=False, client_fault=_client_fault(exc))
        raise
    if upstream.stream is None:
        ticket.tokens = tokens_in(upstream.body) if 200 <= upstream.status < 300 else None
        ticket.status = upstream.status
        if 200 <= upstream.status < 300:
            read_figures(ticket.figures, call.endpoint, call.body, upstream)
        if traced is not None:
            traced.whole(upstream.body, upstream.headers)
        ticket.release(ok=True)  # the next waiter, granted in this step, is sent on first
        await asyncio.sleep(0)
        answer = upstream.body or b""
        if call.answer is not None and 200 <= upstream.status < 300:
            answer = call.answer(answer)
        return Served(upstream.status, headers,
                      upstream.headers.get("content-type", "application/json"), body=answer)
    stream = upstream.stream if traced is None else traced.chunks(upstream.stream)  # as sent
    chunks = call.chunks(stream) if call.chunks else stream
    relayed = slot_stream(coord, chunks, ticket, manifest.id,
                          dialect.stream_end if dialect else openai_stream_end)
    return Served(upstream.status, headers,
                  upstream.headers.get("content-type", "text/event-stream"), chunks=relayed)


def _client_fault(exc: BaseException) -> bool:
    """A client's mistake, or a client that went away: not the model's failure."""
    return isinstance(exc, asyncio.CancelledError) or (
        isinstance(exc, ModelBossError) and 400 <= exc.status_code < 500)
