"""DrainGate: while the daemon drains, a new request is refused (503 ``shutting_down`` with
``Retry-After``; the envelope middleware outside puts it in the route's envelope), except
``/health`` (which says it drains) and ``/metrics``. Every request is registered with the
drain while it runs; one the drain cuts (its task cancelled) is ended here: a 503 if its
answer had not begun, else its stream's own end (OpenAI's error event and ``data: [DONE]``,
the Responses API's numbered ``event: error``, Anthropic's ``event: error``, Ollama's
``{"error": ...}`` line), the same bytes a stream that fails midway ends with."""

from __future__ import annotations

import asyncio
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...coordinator import Coordinator
from ...errors import ModelBossError
from ...services.anthropic.service import DIALECT as ANTHROPIC
from ...services.ollama.stream import error_line
from ...services.responses import DIALECT as RESPONSES
from ...services.served import StreamEnd, openai_stream_end
from ...slots.drain import InFlight, ShuttingDown
from ..anthropic import is_anthropic_path
from ..errors import error_response
from ..ollama import is_ollama_path

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health", "/metrics"})  # answered while the daemon drains
READS = frozenset({"GET", "HEAD", "OPTIONS"})  # not waited for: reads, event streams
STREAMS = frozenset({b"text/event-stream", b"application/x-ndjson"})


def _ollama_end(exc: Exception) -> bytes:
    return error_line(exc.message if isinstance(exc, ModelBossError) else str(exc))


def stream_end(path: str) -> StreamEnd:
    """How a stream on ``path`` ends on a failure, in its API's shape."""
    if is_anthropic_path(path):
        return ANTHROPIC.stream_end
    if is_ollama_path(path):
        return _ollama_end
    if path in ("/v1/responses", "/responses"):  # the Responses API's error event
        return RESPONSES.stream_end
    return openai_stream_end


class _Answer:
    """The send of one request, watched: whether its answer began, its media type, and
    whether it ended (each noted once its message was sent)."""

    def __init__(self, send: Send) -> None:
        self.raw = send
        self.started = False
        self.ended = False
        self.media = b""

    async def send(self, message: Message) -> None:
        await self.raw(message)
        if message["type"] == "http.response.start":
            self.started = True
            for name, value in message.get("headers") or ():
                if name.lower() == b"content-type":
                    self.media = value.split(b";", 1)[0].strip().lower()
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.ended = True


class DrainGate:
    """The drain at the edge (see the module's docstring); the coordinator's
    :class:`~model_boss.slots.drain.Drain` decides when."""

    def __init__(self, app: ASGIApp, coordinator: Coordinator) -> None:
        self.app = app
        self.coord = coordinator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        drain = self.coord.drain
        if drain.draining and scope["path"] not in OPEN_PATHS:
            await error_response(drain.refusal())(scope, receive, send)
            return
        task = asyncio.current_task()
        assert task is not None
        request = drain.enter(task, work=scope["method"] not in READS)
        answer = _Answer(send)
        try:
            try:
                await self.app(scope, receive, answer.send)
            except asyncio.CancelledError:
                if not request.cut or task.uncancel() > 0:
                    raise  # not the drain's cut (or more than it): the server's own cancel
            if request.cut and not answer.ended:
                await self._end(scope, receive, request, answer)
        finally:
            drain.leave(request)

    async def _end(self, scope: Scope, receive: Receive, request: InFlight,
                   answer: _Answer) -> None:
        why = "a second signal" if self.coord.drain.forced else \
            f"shutdown_grace_s ({self.coord.drain.grace_s:g}s) passed"
        cut = ShuttingDown(f"model-boss is shutting down: the request was cut short ({why})")
        try:
            if not answer.started:
                await error_response(cut)(scope, receive, answer.raw)
                return
            tail = stream_end(scope["path"])(cut) \
                if request.work and answer.media in STREAMS else b""
            await answer.raw({"type": "http.response.body", "body": tail, "more_body": False})
        except Exception as exc:  # the client went meanwhile: nobody to tell
            log.debug("ending %s after the drain's cut failed: %s", scope["path"], exc)
