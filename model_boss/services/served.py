"""Served: an answer as every service hands it to its transport, and the names that travel
with one (headers, the SSE error event). A module of its own so that serving here and
forwarding to a member share it without importing each other."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from ..backends.base import UpstreamResponse
from ..errors import ModelBossError
from .redact import redacted

if TYPE_CHECKING:
    from ..scheduling.request import SlotTicket

log = logging.getLogger(__name__)

MODEL_HEADER = "x-model-boss-model"
WAIT_HEADER = "x-model-boss-queue-wait-s"
# where a model runs more than once: the replica that served, and the prompt tokens it was
# estimated to hold already (docs/SCHEDULING.md)
REPLICA_HEADER = "x-model-boss-replica"
CACHED_PREFIX_HEADER = "x-model-boss-cached-prefix-tokens"
# the bytes that end a stream which failed after it began, in the route's own protocol
StreamEnd = Callable[[Exception], bytes]
Chunks = AsyncIterator[bytes]

@dataclass(slots=True)
class Served:
    """An answer: ``body`` whole, or ``chunks`` to pass on as they come."""

    status: int
    headers: dict[str, str]
    media_type: str
    body: bytes = b""
    chunks: AsyncIterator[bytes] | None = None


# what an answer says it generated: OpenAI's usage.completion_tokens, Anthropic's
# usage.output_tokens, llama.cpp's timings.predicted_n and tokens_predicted, Ollama's
# eval_count (read without parsing a body that may be large; in a stream, the last one said)
_GENERATED = re.compile(
    rb'"(?:completion_tokens|output_tokens|predicted_n|tokens_predicted|eval_count)"\s*:\s*(\d+)')


# the last event of a whole answer in each protocol a stream speaks: OpenAI's [DONE], the
# Responses API's response.completed, Anthropic's message_stop, Ollama's "done": true. A
# client that goes once it has one had its whole answer.
_LAST_EVENT = re.compile(rb'data: \[DONE\]|"type"\s*:\s*"(?:response\.completed|message_stop)"'
                         rb'|"done"\s*:\s*true')
# one generated token's event in each protocol: a chat chunk's or Anthropic's or the Responses
# API's "delta", Ollama's "done": false line (a worker streams a token an event)
_TOKEN_EVENT = re.compile(rb'"delta"\s*:|"done"\s*:\s*false')


def tokens_in(body: bytes | None) -> int | None:
    """The tokens a whole answer says it generated; None when it says nothing."""
    found = _GENERATED.findall(body or b"")
    return int(found[-1]) if found else None


def sse_error(exc: Exception) -> bytes:
    """The SSE event that carries a failure once a stream has started (same envelope)."""
    if not isinstance(exc, ModelBossError):
        exc = ModelBossError(f"stream failed: {exc}", code="stream_failed")
    return b"data: " + orjson.dumps(redacted(exc).envelope()) + b"\n\n"


def openai_stream_end(exc: Exception) -> bytes:
    """OpenAI's way: an error event in the envelope, then ``[DONE]``."""
    return sse_error(exc) + b"data: [DONE]\n\n"


@dataclass(slots=True)
class WorkerCall:
    """What one request sends its worker, and how the worker's answer is told back to the
    caller: ``answer`` rewrites a whole 2xx body, ``chunks`` wraps a stream, ``gather``
    makes a stream one whole answer before the slot is given back (a job asks its worker
    for a stream, to count its tokens, and answers whole); ``settled`` is told once the
    request is over, however it ended (with its slot given back)."""

    endpoint: str
    body: dict[str, Any]
    answer: Callable[[bytes], bytes] | None = None
    chunks: Callable[[Chunks], Chunks] | None = None
    gather: Callable[[UpstreamResponse], Awaitable[UpstreamResponse]] | None = None
    settled: Callable[[], None] | None = None


class Dialect(Protocol):
    """A route's API spoken to workers that may speak another: which call a worker gets (its
    own API when it speaks the route's, else a translation), and how a stream ends on a
    failure. Without one, a request reaches the worker as it came."""

    def call(self, backend: Any, model_id: str, endpoint: str,
             body: dict[str, Any]) -> WorkerCall: ...

    def stream_end(self, exc: Exception) -> bytes: ...


async def discard(chunks: AsyncIterator[bytes]) -> None:
    """Close a stream nobody reads. A generator's clean-up runs only once it has started,
    so it is started first."""
    with contextlib.suppress(BaseException):
        await chunks.__anext__()
    with contextlib.suppress(BaseException):
        await chunks.aclose()  # type: ignore[attr-defined]


async def relay(chunks: AsyncIterator[bytes], ticket: SlotTicket, model_id: str,
                end: StreamEnd = openai_stream_end) -> AsyncIterator[bytes]:
    """Pass chunks through untouched; a failure mid-stream ends the stream with ``end`` (an
    SSE error + [DONE] in OpenAI's protocol). A client that goes away mid-stream is no
    failure of the model, and one that goes after its answer's last event was sent had its
    whole answer (``ok``). A client that goes before its stream said what it generated is
    charged the token events relayed to it (a whole stream is charged what it said)."""
    ok = gone = whole = False
    relayed = 0  # token events passed on
    try:
        async for chunk in chunks:
            if isinstance(chunk, bytes):
                said = _GENERATED.findall(chunk)
                if said:  # the last figure a stream gives is its whole count
                    ticket.tokens = int(said[-1])
                ticket.figures.read(chunk)
                relayed += len(_TOKEN_EVENT.findall(chunk))
            yield chunk
            # back here only once the client took the chunk: a last event was delivered
            whole = whole or (isinstance(chunk, bytes) and _LAST_EVENT.search(chunk) is not None)
        ok = True
    except (GeneratorExit, asyncio.CancelledError):
        ok, gone = whole, not whole
        raise
    except Exception as exc:
        if isinstance(exc, ModelBossError):
            log.warning("stream from %s failed: %s", model_id, exc.message)
        else:
            log.exception("stream from %s failed", model_id)
        yield end(exc)
    finally:
        try:
            with contextlib.suppress(Exception):
                await chunks.aclose()  # type: ignore[attr-defined]
        finally:  # even when the close itself is cancelled
            if gone and ticket.tokens is None and relayed:  # cut before it said its count
                ticket.tokens = relayed
            if gone and not ticket.figures.completion_tokens:
                ticket.figures.completion_tokens = ticket.tokens or 0
            ticket.release(ok=ok, client_fault=gone)
