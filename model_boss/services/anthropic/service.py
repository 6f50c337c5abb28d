"""Serving ``/v1/messages`` and ``/v1/messages/count_tokens``: through the same router,
queue, leases, budgets and fallbacks as every route. A worker that speaks Anthropic's API
itself (llama.cpp's server, a cloud remote with ``api: anthropic``) gets the body as it came,
validated here; any other gets it as a chat completion, its answer told back as a message.
Either way the answer is told as Anthropic tells it (:mod:`.answers`), a stream opens at
once and pings while it waits (:mod:`.opening`), system turns go where the model's template
takes them (:mod:`.system_turns`) and errors use Anthropic's words (:mod:`.wording`)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...catalog import BackendKind, ModelManifest
from ...endpoints import CHAT, COUNT_TOKENS, MESSAGES
from ...errors import ModelBossError
from ...tenancy.keys import Identity, end_user_label
from ..cancel import Departure
from ..extensions import Extensions, pop_extensions
from ..served import Chunks, Served, WorkerCall
from ..serving import serve
from ..stream_life import open_early
from .answers import AnswerFacts, tell_body, tell_events
from .opening import MessagesVoice
from .schemas import CountTokensRequest, MessagesRequest, is_server_tool
from .stream import error_event, from_chat_stream, native
from .system_turns import (
    SystemTurnMemory,
    folded,
    has_system_turns,
    lift_leading,
    refuses_system_turns,
)
from .translate import count_answer, from_chat, to_chat
from .wording import in_anthropic_words

if TYPE_CHECKING:
    from ...coordinator import Coordinator

# output_config.effort → the reasoning_effort a template takes (gpt-oss: low, medium, high)
_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}

# the models whose templates refused a system turn: one memory for the process
SYSTEM_TURNS = SystemTurnMemory()


def speaks_anthropic(backend: Any) -> bool:
    """Whether a worker answers Anthropic's Messages API on its own."""
    return bool(getattr(backend, "speaks_anthropic", False))


class MessagesDialect:
    """Anthropic's API to the worker that serves one request (see the module's docstring);
    it notes which model that was."""

    def __init__(self, facts: AnswerFacts, coord: Coordinator, thinking: bool | None = None,
                 memory: SystemTurnMemory = SYSTEM_TURNS) -> None:
        self.facts = facts
        self.coord = coord
        self.thinking = thinking  # x_thinking: for a body that says nothing of thinking
        self.memory = memory
        self.model_id: str | None = None

    def manifest_of(self, model_id: str) -> ModelManifest | None:
        found = self.coord.catalog.find(model_id)
        return found.manifest if found is not None else None

    def call(self, backend: Any, model_id: str, endpoint: str,
             body: dict[str, Any]) -> WorkerCall:
        self.model_id = model_id
        body = self.worker_body(body, model_id)
        facts = self.facts
        # llama.cpp's own /v1/messages takes no per-request ``lora``: a model with adapters
        # (catalog/adapters.py) is asked through its chat route, which does
        if speaks_anthropic(backend) and "lora" not in body:
            if endpoint == COUNT_TOKENS:
                return WorkerCall(endpoint, body)
            return WorkerCall(endpoint, body,
                              answer=lambda raw: tell_body(raw, facts, model_id),
                              chunks=lambda chunks: tell_events(native(chunks, model_id), facts))
        if endpoint == COUNT_TOKENS:
            # no count route in OpenAI's API: a one-token completion says the prompt's size
            chat = to_chat({**body, "max_tokens": 1})
            chat.pop("stream", None)
            return WorkerCall(CHAT, chat, answer=count_answer)

        stops = body.get("stop_sequences")

        def told_back(chunks: Chunks) -> Chunks:
            return tell_events(from_chat_stream(chunks, model_id, stops), facts)

        return WorkerCall(CHAT, to_chat(body),
                          answer=lambda raw: tell_body(from_chat(raw, model_id, stops), facts),
                          chunks=told_back)

    def worker_body(self, body: dict[str, Any], model_id: str) -> dict[str, Any]:
        """What the worker gets: system turns as its template takes them, server tools left
        out, and for llama.cpp the thinking switch and effort as template kwargs (its
        ``/v1/messages`` turns ``thinking.budget_tokens`` into its reasoning budget)."""
        body = folded(body) if self.memory.refuses(model_id) else lift_leading(body)
        tools = body.get("tools")
        if tools and any(is_server_tool(tool) for tool in tools):
            body = {**body, "tools": [t for t in tools if not is_server_tool(t)]}
            if not body["tools"]:
                body.pop("tools")
                body.pop("tool_choice", None)
        manifest = self.manifest_of(model_id)
        if manifest is None or manifest.backend != BackendKind.LLAMA_SERVER:
            return body
        kwargs = dict(body.get("chat_template_kwargs") or {})
        thinking = body.get("thinking")
        default = self.thinking if self.thinking is not None else manifest.thinking
        if thinking:
            kwargs.setdefault("enable_thinking", thinking["type"] != "disabled")
        elif default is not None:
            kwargs.setdefault("enable_thinking", default)
        effort = (body.get("output_config") or {}).get("effort")
        if isinstance(effort, str) and effort in _EFFORTS:
            kwargs.setdefault("reasoning_effort", _EFFORTS[effort])
        return {**body, "chat_template_kwargs": kwargs} if kwargs else body

    def stream_end(self, exc: Exception) -> bytes:
        return error_event(in_anthropic_words(exc, self.model_id, self.manifest_of))


class StreamEnds:
    """How a Messages stream ends on a failure where no request's dialect is at hand (the
    edge ending a stream the drain cut): its ``error`` event."""

    def stream_end(self, exc: Exception) -> bytes:
        return error_event(exc)


DIALECT = StreamEnds()


async def messages(coord: Coordinator, endpoint: str,
                   request: MessagesRequest | CountTokensRequest, headers: Mapping[str, str],
                   identity: Identity | None, disconnected: Departure | None) -> Served:
    """Serve a parsed Messages body on ``endpoint``. ``metadata.user_id`` names the client
    as ``x_client_id`` does; ``x_thinking`` stands for a ``thinking`` the body leaves out."""
    data = request.model_dump(exclude_unset=True)
    user = (data.get("metadata") or {}).get("user_id")
    if user and "x_client_id" not in data:
        data["x_client_id"] = end_user_label(user)
    ext = pop_extensions(data, headers, identity)
    facts = AnswerFacts.of(data)
    if endpoint == MESSAGES and data.get("stream"):
        ext.request_id = ext.request_id or "req-" + uuid.uuid4().hex[:16]
        voice = MessagesVoice(coord, _model_name(coord, data.get("model")), ext.request_id)
        return await open_early(coord, _serve(coord, endpoint, data, ext, disconnected, facts),
                                voice)
    return await _serve(coord, endpoint, data, ext, disconnected, facts)


async def _serve(coord: Coordinator, endpoint: str, data: dict[str, Any], ext: Extensions,
                 disconnected: Departure | None, facts: AnswerFacts) -> Served:
    """:func:`serve` with this request's dialect; a template that refuses a system turn is
    remembered and the request served again with its system turns folded. Errors leave in
    Anthropic's words."""
    dialect = MessagesDialect(facts, coord, ext.thinking)
    try:
        try:
            return await serve(coord, endpoint, data, ext, disconnected=disconnected,
                               dialect=dialect)
        except ModelBossError as exc:
            if dialect.model_id is None or SYSTEM_TURNS.refuses(dialect.model_id) \
                    or not has_system_turns(lift_leading(data)) \
                    or not refuses_system_turns(exc):
                raise  # not a system turn refused, or refused folded too
            SYSTEM_TURNS.learn(dialect.model_id)
            dialect = MessagesDialect(facts, coord, ext.thinking)
            return await serve(coord, endpoint, data, ext, disconnected=disconnected,
                               dialect=dialect)
    except ModelBossError as exc:
        in_anthropic_words(exc, dialect.model_id, dialect.manifest_of)
        raise


def _model_name(coord: Coordinator, name: Any) -> str:
    """The model a stream names before its answer does: the model's id for an id or alias,
    else the name asked for (a task)."""
    if not isinstance(name, str):
        return "default"
    found = coord.catalog.find(name)
    return found.manifest.id if found is not None else name
