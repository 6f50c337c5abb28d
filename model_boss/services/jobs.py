"""The work behind a job: checked as its live request would be when it is submitted, then
served the same path a live request takes, with no caller waiting.

A chat or text completion job asks its worker for a stream and counts the tokens as they
pass (its progress), then answers whole: the stream put together as a llama.cpp worker's
whole answers always are (:mod:`~model_boss.backends.llama.collect`), so the result is the
body a request with ``stream: false`` gets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from ..backends.base import UpstreamResponse
from ..backends.llama.collect import as_stream, collectable, gather
from ..backends.sse import sse_data
from ..endpoints import endpoint_kind
from ..errors import BadRequest, Forbidden
from ..jobs import Job
from ..jobs.runner import Dispatched, Reported
from ..observability import tracing
from ..tenancy.keys import Identity, kind_in_scope
from .accounting import who
from .extensions import CARRIED_IDENTITY, pop_extensions
from .media.images import EDITS, IMAGES, edit_body, edit_images, generate_images, references
from .media.videos import VIDEOS, make_video, video_body
from .schemas import ENDPOINT_BODIES, EditRequest, ImageRequest, VideoRequest
from .served import Served, WorkerCall, openai_stream_end
from .serving import admit, serve
from .validation import parse

if TYPE_CHECKING:
    from ..coordinator import Coordinator

# the fields of a streamed choice that carry generated text (a token an event, as llama.cpp
# streams them)
_GENERATED = ("content", "reasoning_content", "tool_calls", "text")
_YIELDS: set[asyncio.Task] = set()  # requeues under way (kept from the collector)


async def accept_job(coord: Coordinator, endpoint: str, body: dict[str, Any],
                     headers: Mapping[str, str], identity: Identity | None,
                     client_id: str | None) -> tuple[dict[str, Any], str]:
    """Check a job's request as its live request is checked, before the job is taken: the
    body by the endpoint's schema (a 400 naming the field), ``stream`` refused (a job answers
    whole), then the route and its models (:func:`admit`: an unknown model or task is the
    live request's 404). Returns the body to keep and the job's client id."""
    schema = ENDPOINT_BODIES.get(endpoint)
    if schema is None:
        raise BadRequest(f"endpoint: '{endpoint}' cannot be a job; jobs run "
                         f"{', '.join(ENDPOINT_BODIES)}", param="endpoint",
                         code="unsupported_endpoint")
    request = parse(schema, body)
    if request.stream:
        raise BadRequest("stream: a job returns its whole result when it finishes (GET "
                         "/api/v1/jobs/{id}), with its tokens so far as its progress; leave "
                         "'stream' out", param="stream", code="stream_not_supported")
    _pictures_checked(coord, request)
    kept = request.model_dump(exclude_unset=True)
    for name in CARRIED_IDENTITY:  # only this service writes them (below), never a client
        kept.pop(name, None)
    fields = dict(kept)
    ext = pop_extensions(fields, headers, identity)
    if identity is None or not identity.keyed:  # under a key, the key is the client
        ext.client_id = ext.client_id or client_id or "anonymous"
    await admit(coord, endpoint, fields, ext)
    asker = who(coord, ext, fields)
    if asker.profile is not None and asker.keyed and not kind_in_scope(
            asker.profile, endpoint_kind(endpoint)):
        raise Forbidden(f"the key '{asker.key}' may not call {endpoint_kind(endpoint)} "
                        "routes", code="endpoint_not_allowed")
    if asker.keyed:  # the job runs later, as the key it was taken from
        kept.update(x_key=asker.key, x_end_user=asker.end_user)
        return kept, asker.key
    return kept, ext.client_id


async def submitted(coord: Coordinator, endpoint: str, body: dict[str, Any],
                    client_id: str) -> Job:
    """Take the job (checked by :func:`accept_job`), with its submit's span's context kept
    in it where traces are on: its run, on whichever member takes it, links to it."""
    with tracing.span("model_boss.job.submit", {"url.path": endpoint}) as submit:
        job = await coord.jobs.submit(endpoint, body, client_id,
                                      trace=tracing.context_headers())
        tracing.annotate({"model_boss.job.id": job.id}, submit)
    return job


def _pictures_checked(coord: Coordinator, request: Any) -> None:
    """The pictures a job brings, checked as its live request's are: a 400 at submission
    for one that is not a picture, not when the job runs."""
    max_side = coord.settings.max_image_side
    if isinstance(request, EditRequest):
        edit_body(request, max_side)
    elif isinstance(request, VideoRequest):
        video_body(request, max_side)
    elif isinstance(request, ImageRequest):
        references(request.reference_images, request.reference_strength, max_side)


@contextlib.contextmanager
def _yields(coord: Coordinator, job: Job) -> Iterator[None]:
    """While it runs, a video job gives its slot back when the queue asks (a more important
    request waits for its model's room): its worker stops at the next denoising step and the
    job waits in the queue again, to start over (``yields`` counts it)."""
    def ask() -> None:
        coord.events.emit("job_yielded", job=job.id, model=job.model)
        task = asyncio.create_task(coord.jobs.requeue(job.id))
        _YIELDS.add(task)
        task.add_done_callback(_YIELDS.discard)

    coord.queue.yieldable[job.id] = ask
    try:
        yield
    finally:
        coord.queue.yieldable.pop(job.id, None)


def job_key(job: Job) -> str | None:
    """The key a job was taken from (None: taken with no keys configured)."""
    key = job.body.get("x_key")
    return key if isinstance(key, str) else None


async def run_job(coord: Coordinator, job: Job, on_dispatch: Dispatched,
                  report: Reported) -> Served:
    """Serve the job's request; where traces are on, as a trace of its own whose first span
    (``model_boss.job.run``) links to the submit's."""
    with tracing.linked_span("model_boss.job.run", job.trace, {
            "model_boss.job.id": job.id, "url.path": job.endpoint,
            "model_boss.job.yields": job.yields}):
        return await _run(coord, job, on_dispatch, report)


async def _run(coord: Coordinator, job: Job, on_dispatch: Dispatched,
               report: Reported) -> Served:
    body = dict(job.body)
    key, end_user = job_key(job), body.get("x_end_user")
    ext = pop_extensions(body, {}, None)
    ext.client_id = ext.client_id or job.client_id
    if key is not None:
        ext.identity = Identity(key, record=coord.keys.get(key),
                                end_user=end_user if isinstance(end_user, str) else None)
    ext.request_id = job.id  # its place in the queue is found by the job's id
    if job.endpoint == IMAGES:
        request = parse(ImageRequest, {**body, **ext.extra})
        return await generate_images(coord, request, ext, coord.base_url,
                                     on_dispatch=on_dispatch)
    if job.endpoint == EDITS:
        edit = parse(EditRequest, {**body, **ext.extra})
        return await edit_images(coord, edit, ext, coord.base_url, on_dispatch=on_dispatch)
    if job.endpoint == VIDEOS:
        clip = parse(VideoRequest, {**body, **ext.extra})
        with _yields(coord, job):
            return await make_video(coord, job, clip, ext, on_dispatch)
    body["stream"] = False
    return await serve(coord, job.endpoint, body, ext, on_dispatch=on_dispatch,
                       dialect=TokenCount(report))


class TokenCount:
    """The dialect of a job's request: a chat or text completion that can be put together
    from its stream (one choice) is asked as one, its tokens counted as they pass, and
    gathered whole before its slot is given back; anything else goes as it came."""

    stream_end = staticmethod(openai_stream_end)

    def __init__(self, report: Reported) -> None:
        self.report = report
        self.tokens = 0

    def call(self, backend: Any, model_id: str, endpoint: str,
             body: dict[str, Any]) -> WorkerCall:
        if not collectable(endpoint, body) or (body.get("n") or 1) > 1:
            return WorkerCall(endpoint, body)

        async def whole(upstream: UpstreamResponse) -> UpstreamResponse:
            return await gather(endpoint, upstream, model_id, self._counted)

        self.tokens = 0  # a task's next rung starts over
        return WorkerCall(endpoint, as_stream(endpoint, body), gather=whole)

    def _counted(self, event: bytes) -> None:
        data = sse_data(event)
        if not data or data == b"[DONE]":
            return
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return  # not the job's to judge: the gathering says what is wrong
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        generated = sum(1 for choice in choices or [] if _generated(choice))
        if generated:
            self.tokens += generated
            self.report({"tokens": self.tokens})


def _generated(choice: Any) -> bool:
    """Whether a streamed choice carries generated text: a chat delta's content, reasoning or
    tool call, a text completion's text."""
    if not isinstance(choice, dict):
        return False
    fields = choice.get("delta") if "delta" in choice else choice
    return isinstance(fields, dict) and any(fields.get(name) for name in _GENERATED)
