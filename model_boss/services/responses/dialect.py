"""``POST /v1/responses`` to llama.cpp's server, answered as OpenAI's Responses API answers.

llama.cpp's server speaks the Responses API itself; what it leaves out of its stream is put
in on the way back (:mod:`.events`), and a whole answer is that same stream gathered, so both
carry the same ids, indexes and usage (:mod:`.whole`). ``prompt_cache_key`` keeps a session
on one slot where it can (:mod:`.affinity`). Other workers (a cloud remote, a command's
server) get the request and answer it as they came.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import AsyncIterator
from typing import Any

import orjson

from ...backends.base import UpstreamResponse
from ...backends.llama.collect import gather
from ...backends.sse import sse_data, sse_events
from ...endpoints import RESPONSES
from ...errors import ModelBossError
from ..redact import redacted
from ..served import Chunks, WorkerCall
from .affinity import SlotAffinity
from .events import ResponsesStream, encoded

# each worker's slot choices, for as long as the worker lives
_AFFINITIES: weakref.WeakKeyDictionary[Any, SlotAffinity] = weakref.WeakKeyDictionary()


def numbers_responses(backend: Any) -> bool:
    """Whether a worker is llama.cpp's server, whose Responses events are told here."""
    return bool(getattr(backend, "llama_responses", False))


def affinity_of(backend: Any) -> SlotAffinity:
    found = _AFFINITIES.get(backend)
    if found is None:
        slots = getattr(getattr(backend, "manifest", None), "concurrency", 1)
        found = _AFFINITIES[backend] = SlotAffinity(slots)
    return found


async def told(chunks: Chunks, model_id: str) -> AsyncIterator[bytes]:
    """llama.cpp's Responses stream as OpenAI's (:class:`.events.ResponsesStream`); comments
    and lines that are not JSON pass untouched. A failure keeps the next sequence number on
    the exception, for the error event that ends the stream (:meth:`ResponsesDialect.
    stream_end`)."""
    stream = ResponsesStream(model_id)
    try:
        async for whole in sse_events(chunks):
            data = sse_data(whole)
            try:
                event = orjson.loads(data) if data is not None else None
            except orjson.JSONDecodeError:
                event = None
            if not isinstance(event, dict):
                yield whole
                continue
            sent = stream.feed(event)
            if sent:
                yield b"".join(encoded(e) for e in sent)
    except Exception as exc:
        with contextlib.suppress(AttributeError):
            exc.sequence_number = stream.sequence  # type: ignore[attr-defined]
        raise
    finally:
        with contextlib.suppress(Exception):
            await chunks.aclose()  # type: ignore[attr-defined]


class ResponsesDialect:
    """The Responses API to llama.cpp's server (see the module); to others as it came."""

    def call(self, backend: Any, model_id: str, endpoint: str,
             body: dict[str, Any]) -> WorkerCall:
        if endpoint != RESPONSES or not numbers_responses(backend):
            return WorkerCall(endpoint, body)
        body = dict(body)
        key = body.get("prompt_cache_key")
        if key is not None:
            body.setdefault("cache_prompt", True)
        affinity = affinity_of(backend)
        slot = affinity.take(key if isinstance(key, str) and "id_slot" not in body else None)
        if slot is not None:
            body["id_slot"] = slot

        def settled() -> None:
            affinity.give_back(slot)

        if body.get("stream"):
            return WorkerCall(endpoint, body, chunks=lambda chunks: told(chunks, model_id),
                              settled=settled)

        async def whole(upstream: UpstreamResponse) -> UpstreamResponse:
            if upstream.stream is not None:
                upstream = UpstreamResponse(upstream.status, upstream.headers,
                                            stream=told(upstream.stream, model_id))
            return await gather(RESPONSES, upstream, model_id)

        # asked as a stream and gathered: a caller who leaves stops the generation, and the
        # whole answer says what the stream would (ids, indexes, reasoning tokens)
        return WorkerCall(endpoint, {**body, "stream": True}, gather=whole, settled=settled)

    def stream_end(self, exc: Exception) -> bytes:
        """The Responses API's ``error`` event, numbered after the last event sent; with the
        error envelope too, which OpenAI's SDK raises as an ``APIError``."""
        sequence = getattr(exc, "sequence_number", 0)
        if not isinstance(exc, ModelBossError):
            exc = ModelBossError(f"stream failed: {exc}", code="stream_failed")
        envelope = redacted(exc).envelope()["error"]
        return encoded({"type": "error", "code": exc.code, "message": exc.message,
                        "param": exc.param, "sequence_number": sequence, "error": envelope})


DIALECT = ResponsesDialect()
