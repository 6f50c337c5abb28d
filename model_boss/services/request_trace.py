"""One request's spans past the edge, where traces are on: the load it waited for (and that
load's stages), the worker's part (from its own ``timings``: llama.cpp's prompt processing
and generation, a diffusers worker's denoising steps, a transformers worker's batch;
:mod:`model_boss.observability.worker_timings`), the stream to the client, and the token
counts, streamed answers too.

:func:`begin` hands out None when traces are off, or when the request runs outside any trace
(a realtime session's inner calls): serving then makes no span and pays one ``is None``.
No attribute carries prompt text or a key's secret: the key's name, never the key.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..backends.diffusers import VIDEO_HEADER
from ..observability import tracing, worker_timings
from ..observability.load_stages import LoadStages

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from ..coordinator import Coordinator
    from ..scheduling.request import QueuedRequest, SlotTicket

UNTRACED = contextlib.nullcontext()  # the worker call's block where traces are off
_LOADS: weakref.WeakKeyDictionary[Any, LoadStages] = weakref.WeakKeyDictionary()


def follow_loads(coord: Coordinator) -> None:
    """Hear ``coord``'s load stages from now on (called once traces are turned on)."""
    if coord.events not in _LOADS:
        stages = _LOADS[coord.events] = LoadStages()
        coord.events.listen(stages.heard)


def begin(coord: Coordinator, queued: QueuedRequest) -> RequestTrace | None:
    """The request's trace, under the span now current (the edge's); None when off or
    outside a trace. Names the model, key, end user and priority on the request's span and
    keeps its trace id with the request (the request log's row shows it)."""
    request_span = tracing.current_span()
    if request_span is None or not request_span.get_span_context().is_valid:
        return None
    queued.trace_id = tracing.trace_id_of(request_span)
    tracing.annotate({"gen_ai.request.model": queued.model_id,
                      "gen_ai.operation.name": _operation(queued.endpoint),
                      "model_boss.key": queued.key or None,
                      "model_boss.end_user": queued.end_user or None,
                      "model_boss.priority": queued.priority}, request_span)
    return RequestTrace(request_span, _LOADS.get(coord.events), queued.priority)


def _operation(endpoint: str) -> str | None:
    """GenAI's operation name for the routes that have one."""
    if "chat" in endpoint or endpoint.endswith("/messages"):
        return "chat"
    if "embed" in endpoint:
        return "embeddings"
    if endpoint.endswith("/completions") or endpoint.endswith("/completion"):
        return "text_completion"
    return None


class RequestTrace:
    """The spans one granted request makes; ended, with the counts, once its slot goes
    back (:meth:`settled`, among the ticket's clean-ups)."""

    def __init__(self, request_span: Span, loads: LoadStages | None, priority: int) -> None:
        self.request_span = request_span
        self.loads = loads
        self.priority = priority
        self.worker: Span | None = None
        self.stream: Span | None = None
        self.timings: dict[str, Any] | None = None
        self.call_ns = 0
        self.last_chunk_ns: int | None = None
        self.ticket: SlotTicket | None = None

    def waiting(self, depth: int) -> Span | None:
        """The wait in the queue begins (``depth``: the requests queued as it came)."""
        return tracing.start_span("model_boss.queue_wait", {
            "model_boss.priority": self.priority, "model_boss.queue.depth_at_entry": depth},
            parent=self.request_span)

    def not_granted(self, waited: Span | None, exc: BaseException) -> None:
        """The wait ended without a slot: cancelled, refused or failed in the queue."""
        tracing.failed(waited, exc)
        if waited is not None:
            waited.end()

    def granted(self, ticket: SlotTicket, waited: Span | None) -> None:
        """The slot was granted: the wait ends; the slot key and lease on the request's span,
        and the load it waited for, with that load's stages as its children."""
        self.ticket = ticket
        slot, request = ticket.slot, ticket.request
        if waited is not None:
            waited.set_attribute("model_boss.slot_key", str(slot.key))
            waited.end()
        lease = getattr(slot, "lease", None)
        tracing.annotate({"model_boss.slot_key": str(slot.key),
                          "model_boss.lease_id": getattr(lease, "id", None),
                          "model_boss.queue.wait_s": ticket.waited_s}, self.request_span)
        ticket.settled.append(self.settled)
        if ticket.load_wait_s <= 0:
            return
        began, ended = request.submitted_at, request.submitted_at + ticket.load_wait_s
        load = self.loads.of(slot.model_id, slot.loaded_at) if self.loads else None
        attributes: dict[str, Any] = {"model_boss.slot_key": str(slot.key),
                                      "model_boss.load.waited_s": ticket.load_wait_s}
        if load is not None:
            attributes.update({"model_boss.load.tier": load.tier,
                               "model_boss.load.seconds": round(
                                   load.ended_at - load.stages[0][1], 4) if load.stages
                               else None})
            ended = max(ended, load.ended_at)
        whole = tracing.ended_span("model_boss.load", _ns(began), _ns(ended), attributes,
                                   parent=self.request_span)
        for stage, stage_began, stage_ended in load.spans(since=began) if load else ():
            tracing.ended_span(f"model_boss.load.{stage}", _ns(stage_began), _ns(stage_ended),
                               {"model_boss.load.stage": stage,
                                "model_boss.load.tier": load.tier}, parent=whole)

    @contextlib.contextmanager
    def calling(self, endpoint: str, model: str) -> Iterator[None]:
        """The call into the worker, current while it is made so the worker's HTTP request
        carries it as ``traceparent``; it ends with the answer (a stream's last chunk)."""
        assert self.ticket is not None
        self.call_ns = time.time_ns()
        self.worker = tracing.start_span("model_boss.worker_call", {
            "model_boss.slot_key": str(self.ticket.slot.key), "url.path": endpoint,
            "gen_ai.request.model": model}, parent=self.request_span, start_ns=self.call_ns,
            client=True)
        try:
            with tracing.use(self.worker):
                yield
        except BaseException as exc:
            tracing.failed(self.worker, exc)
            self._end()
            raise

    def whole(self, body: bytes | None, headers: Mapping[str, str]) -> None:
        """A whole answer came: the worker's timings are read from it (a clip's from the
        header that carries its figures)."""
        self.last_chunk_ns = time.time_ns()
        figures = headers.get(VIDEO_HEADER)
        self.timings = worker_timings.read(figures.encode() if figures else body or b"")

    async def chunks(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The worker's chunks as it sends them (before a route's dialect rewrites them): the
        stream's span begins with the first, the timings are read from each (llama.cpp says
        them in its last event)."""
        try:
            async for chunk in chunks:
                if self.stream is None:
                    self.stream = tracing.start_span("model_boss.stream",
                                                     parent=self.request_span)
                if isinstance(chunk, bytes):
                    self.last_chunk_ns = time.time_ns()
                    timings = worker_timings.read(chunk)
                    if timings:
                        self.timings = timings
                yield chunk
        finally:
            with contextlib.suppress(Exception):
                await chunks.aclose()  # type: ignore[attr-defined]

    def settled(self) -> None:
        """The slot went back (the answer is whole, or the stream ended): the counts on the
        request's and the worker's spans, the worker's own timings as its attributes and child
        spans, and every span still open ended."""
        ticket = self.ticket
        if ticket is None:
            return
        figures = ticket.figures
        usage = {"gen_ai.usage.input_tokens": figures.prompt_tokens or None,
                 "gen_ai.usage.output_tokens": figures.completion_tokens or ticket.tokens,
                 "model_boss.cached_tokens": figures.cached_tokens or None}
        tracing.annotate(usage, self.request_span)
        if self.stream is not None:
            tracing.annotate({"gen_ai.usage.output_tokens": usage["gen_ai.usage.output_tokens"]},
                             self.stream)
            self.stream.end()
            self.stream = None
        if self.worker is not None:
            tracing.annotate(usage, self.worker)
            worker_timings.tell(self.timings, self.worker, self.call_ns,
                                self.last_chunk_ns or time.time_ns())
        self._end()

    def _end(self) -> None:
        if self.worker is not None:
            self.worker.end(end_time=self.last_chunk_ns)
            self.worker = None


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)
