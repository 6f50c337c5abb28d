"""Serving ``/v1/messages`` and ``/v1/messages/count_tokens``: through the same router,
queue, leases, budgets and fallbacks as every route. A worker that speaks Anthropic's API
itself (llama.cpp's server, a cloud remote with ``api: anthropic``) gets the body as it came,
validated here; any other gets it as a chat completion, its answer told back as a message."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from ..cancel import Departure
from ..extensions import pop_extensions
from ..load_wait import serve_streaming
from ..served import Chunks, Served, WorkerCall
from .schemas import CountTokensRequest, MessagesRequest
from .stream import error_event, from_chat_stream, native
from .translate import count_answer, from_chat, to_chat

if TYPE_CHECKING:
    from ...coordinator import Coordinator

MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
CHAT = "/v1/chat/completions"


def speaks_anthropic(backend: Any) -> bool:
    """Whether a worker answers Anthropic's Messages API on its own."""
    return bool(getattr(backend, "speaks_anthropic", False))


class MessagesAdapter:
    """Anthropic's API to any worker (see the module's docstring)."""

    def call(self, backend: Any, model_id: str, endpoint: str,
             body: dict[str, Any]) -> WorkerCall:
        if speaks_anthropic(backend):
            thinking = body.get("thinking")
            if thinking:  # llama.cpp's templates take the toggle as a template kwarg
                kwargs = dict(body.get("chat_template_kwargs") or {})
                kwargs.setdefault("enable_thinking", thinking["type"] != "disabled")
                body["chat_template_kwargs"] = kwargs
            if endpoint == COUNT_TOKENS:
                return WorkerCall(endpoint, body)
            return WorkerCall(endpoint, body, answer=lambda raw: _named(raw, model_id),
                              chunks=lambda chunks: native(chunks, model_id))
        if endpoint == COUNT_TOKENS:
            # no count route in OpenAI's API: a one-token completion says the prompt's size
            chat = to_chat({**body, "max_tokens": 1})
            chat.pop("stream", None)
            return WorkerCall(CHAT, chat, answer=count_answer)

        stops = body.get("stop_sequences")

        def told_back(chunks: Chunks) -> Chunks:
            return from_chat_stream(chunks, model_id, stops)

        return WorkerCall(CHAT, to_chat(body),
                          answer=lambda raw: from_chat(raw, model_id, stops), chunks=told_back)

    def stream_end(self, exc: Exception) -> bytes:
        return error_event(exc)


ADAPTER = MessagesAdapter()


def _named(raw: bytes, model_id: str) -> bytes:
    """A worker's message, with the model's id as its ``model`` (a worker may name its file)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw
    if isinstance(data, dict) and "model" in data:
        data["model"] = model_id
        return orjson.dumps(data)
    return raw


async def messages(coord: Coordinator, endpoint: str,
                   request: MessagesRequest | CountTokensRequest, headers: Mapping[str, str],
                   disconnected: Departure | None) -> Served:
    """Serve a parsed Messages body on ``endpoint``. ``metadata.user_id`` names the client
    as ``x_client_id`` does."""
    data = request.model_dump(exclude_unset=True)
    user = (data.get("metadata") or {}).get("user_id")
    if user and "x_client_id" not in data:
        data["x_client_id"] = user[:200]
    ext = pop_extensions(data, headers)
    return await serve_streaming(coord, endpoint, data, ext, disconnected=disconnected,
                                 adapter=ADAPTER)
