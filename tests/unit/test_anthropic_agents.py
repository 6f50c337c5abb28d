"""The Messages API as coding agents use it (Claude Code 2.x): every request body under
tests/data/agents/ (shaped as Claude Code sends them; captures from the real binary belong
there too) is accepted, translated for llama.cpp and for OpenAI-compatible workers, and its
answers told as Anthropic tells them; plus the pieces one by one, table-driven: system turns,
cache breakpoints, ids, stop reasons, error wordings, and (in-process, over fake workers) the
stream that opens at once and pings while it waits."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from model_boss.backends.base import UpstreamResponse
from model_boss.errors import UpstreamError
from model_boss.services.anthropic import opening
from model_boss.services.anthropic.answers import (
    CONTEXT_FULL,
    AnswerFacts,
    anthropic_id,
    stop_reason,
    tell_events,
    tell_message,
    usage,
)
from model_boss.services.anthropic.schemas import MessagesRequest
from model_boss.services.anthropic.service import SYSTEM_TURNS, MessagesDialect
from model_boss.services.anthropic.system_turns import (
    FOLD_CLOSE,
    FOLD_OPEN,
    SystemTurnMemory,
    folded,
    lift_leading,
    refuses_system_turns,
)
from model_boss.services.anthropic.translate import to_chat
from model_boss.services.anthropic.wording import in_anthropic_words
from model_boss.services.validation import parse

from .fakes import FakeBackend, coordinator, manifest, started_client

AGENTS = Path(__file__).resolve().parents[1] / "data" / "agents"
BODIES = sorted(AGENTS.glob("*.json"))
ANTHROPIC_ONLY = {"system", "thinking", "metadata", "context_management", "output_config",
                  "service_tier", "stop_sequences", "cache_control"}


def validated(path: Path) -> dict[str, Any]:
    """A recorded body as the route validates it (model-boss's own model named)."""
    body = {**json.loads(path.read_text()), "model": "a"}
    return parse(MessagesRequest, body).model_dump(exclude_unset=True)


def test_there_are_recorded_bodies() -> None:
    assert len(BODIES) >= 3, "tests/data/agents/ lost its Claude Code bodies"


class _Catalog:
    def __init__(self, backend: str = "llama-server", thinking: bool | None = None) -> None:
        self.backend, self.thinking = backend, thinking

    def find(self, name: str) -> Any:
        found = parse_manifest(name, self.backend, self.thinking)
        return type("Entry", (), {"manifest": found})()


def parse_manifest(model_id: str, backend: str, thinking: bool | None) -> Any:
    from model_boss.catalog import ModelManifest

    extra: dict[str, Any] = {"path": "x.gguf"} if backend == "llama-server" else \
        {"base_url": "http://127.0.0.1:1/v1"}
    return ModelManifest(id=model_id, category="llm", backend=backend, ctx_size=4096,
                         parallel=2, thinking=thinking, **extra)


def dialect(body: dict[str, Any], backend: str = "llama-server",
            memory: SystemTurnMemory | None = None) -> MessagesDialect:
    coord = type("Coord", (), {"catalog": _Catalog(backend)})()
    return MessagesDialect(AnswerFacts.of(body), coord,  # type: ignore[arg-type]
                           memory=memory or SystemTurnMemory())


def roles(messages: list[dict[str, Any]]) -> list[str]:
    return [m["role"] for m in messages]


# --- every recorded body ------------------------------------------------------------------

@pytest.mark.parametrize("path", BODIES, ids=lambda p: p.stem)
def test_a_recorded_body_goes_to_llama_cpp_as_its_template_takes_it(path: Path) -> None:
    body = validated(path)
    sent = dialect(body).worker_body(body, "a")
    # system turns that open the conversation join the top-level system; later ones stay
    lead = next(i for i, m in enumerate(body["messages"]) if m["role"] != "system")
    assert sent["messages"] == body["messages"][lead:]
    kwargs = sent.get("chat_template_kwargs") or {}
    if body.get("thinking"):
        assert kwargs["enable_thinking"] is (body["thinking"]["type"] != "disabled")
        if body["thinking"].get("budget_tokens"):  # llama.cpp makes it its reasoning budget
            assert sent["thinking"]["budget_tokens"] == body["thinking"]["budget_tokens"]
    if (body.get("output_config") or {}).get("effort"):
        assert kwargs["reasoning_effort"] in ("low", "medium", "high")
    for tool in sent.get("tools") or []:
        assert tool["input_schema"]["type"] == "object"


@pytest.mark.parametrize("path", BODIES, ids=lambda p: p.stem)
def test_a_recorded_body_folds_for_a_template_that_refuses_system_turns(path: Path) -> None:
    body = validated(path)
    memory = SystemTurnMemory()
    memory.learn("a")
    sent = dialect(body, memory=memory).worker_body(body, "a")
    said = roles(sent["messages"])
    assert "system" not in said
    assert all(a != b for a, b in zip(said, said[1:], strict=False)), said  # alternating
    turns = [m for m in body["messages"][1:] if m["role"] == "system"]
    text = json.dumps(sent["messages"])
    for turn in turns:
        assert json.dumps(FOLD_OPEN + turn["content"][0]["text"])[1:-1] in text


@pytest.mark.parametrize("path", BODIES, ids=lambda p: p.stem)
def test_a_recorded_body_translates_to_chat(path: Path) -> None:
    body = validated(path)
    chat = to_chat(dialect(body, backend="cloud").worker_body(body, "a"))
    assert not ANTHROPIC_ONLY & set(chat)
    assert set(roles(chat["messages"])) <= {"system", "user", "assistant", "tool"}
    assert chat["messages"][0]["role"] == "system" if body.get("system") else True
    for tool in chat.get("tools") or []:
        assert tool["type"] == "function" and tool["function"]["parameters"]["type"] == "object"
    assert "chat_template_kwargs" not in chat or body.get("thinking")


@pytest.mark.parametrize("path", BODIES, ids=lambda p: p.stem)
def test_a_recorded_body_splits_its_usage_at_its_breakpoints(path: Path) -> None:
    body = validated(path)
    facts = AnswerFacts.of(body)
    marked = "cache_control" in json.dumps(body)
    assert (facts.uncached_tail is not None) == marked
    first = usage({"input_tokens": 1000, "output_tokens": 5}, facts)
    again = usage({"input_tokens": 3, "cache_read_input_tokens": 997, "output_tokens": 5},
                  facts)
    for told in (first, again):
        assert told["input_tokens"] + told.get("cache_read_input_tokens", 0) \
            + told.get("cache_creation_input_tokens", 0) == 1000
    if marked:  # the prefix up to the last breakpoint is written once, then read
        assert first["cache_creation_input_tokens"] > 900
        assert again["cache_read_input_tokens"] == 997


# --- system turns ---------------------------------------------------------------------------

U, A = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}


def system(text: str) -> dict[str, Any]:
    return {"role": "system", "content": [{"type": "text", "text": text}]}


def block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": FOLD_OPEN + text + FOLD_CLOSE}


@pytest.mark.parametrize("messages, expected", [
    ([U, A, system("s"), U], [U, A, {"role": "user", "content": [block("s"), *[
        {"type": "text", "text": "hi"}]]}]),
    ([U, system("s")], [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                                     block("s")]}]),
    ([U, system("s"), U], [{"role": "user", "content": [
        {"type": "text", "text": "hi"}, block("s"), {"type": "text", "text": "hi"}]}]),
    ([U, A, system("s"), system("t"), U], [U, A, {"role": "user", "content": [
        block("s"), block("t"), {"type": "text", "text": "hi"}]}]),
])
def test_folding(messages: list, expected: list) -> None:
    assert folded({"messages": messages})["messages"] == expected


def test_leading_system_turns_join_the_system_prompt() -> None:
    body = lift_leading({"system": [{"type": "text", "text": "top"}],
                         "messages": [system("first"), U, system("later")]})
    assert body["system"] == [{"type": "text", "text": "top"},
                              {"type": "text", "text": "\n\nfirst"}]
    assert body["messages"] == [U, system("later")]


def test_only_an_assistant_turn_folds_into_the_system_prompt() -> None:
    body = folded({"messages": [A, system("s")]})
    assert body["messages"] == [A] and body["system"] == [{"type": "text", "text": "s"}]


@pytest.mark.parametrize("message, refused", [
    ("a: Jinja Exception: Conversation roles must alternate user/assistant/user/assistant", True),
    ('messages.3: Unexpected role "system". The Messages API accepts a top-level `system`',
     True),
    ("System role not supported", True),
    ("a: the request exceeds the available context size", False),
])
def test_what_a_refused_system_turn_says(message: str, refused: bool) -> None:
    assert refuses_system_turns(UpstreamError(message, status_code=400)) is refused
    assert not refuses_system_turns(UpstreamError(message))  # a 502 is the worker's


def test_a_system_message_holds_text_only() -> None:
    with pytest.raises(Exception, match="text blocks only"):
        parse(MessagesRequest, {"model": "a", "max_tokens": 5, "messages": [
            U, {"role": "system", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]})


def test_system_turns_alone_are_no_conversation() -> None:
    with pytest.raises(Exception, match="role 'user' or 'assistant'"):
        parse(MessagesRequest, {"model": "a", "max_tokens": 5, "messages": [system("s")]})


def test_server_tools_are_taken_and_not_offered() -> None:
    body = parse(MessagesRequest, {"model": "a", "max_tokens": 5, "messages": [U], "tools": [
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 8}],
        "tool_choice": {"type": "auto"}}).model_dump(exclude_unset=True)
    sent = dialect(body).worker_body(body, "a")
    assert "tools" not in sent and "tool_choice" not in sent
    with pytest.raises(Exception, match="input_schema"):
        parse(MessagesRequest, {"model": "a", "max_tokens": 5, "messages": [U],
                                "tools": [{"name": "f"}]})


# --- how an answer is told ------------------------------------------------------------------

@pytest.mark.parametrize("given, prefix, expected", [
    ("chatcmpl-RXh1JBo3yIZ3DQ", "msg_", "msg_RXh1JBo3yIZ3DQ"),
    ("msg_01abc", "msg_", "msg_01abc"),
    ("call_fake", "toolu_", "toolu_fake"),
    ("ZPyHk3DFgr0pEgbq1", "toolu_", "toolu_ZPyHk3DFgr0pEgbq1"),
    ("toolu_01A0", "toolu_", "toolu_01A0"),
])
def test_ids(given: str, prefix: str, expected: str) -> None:
    assert anthropic_id(given, prefix) == expected
    assert anthropic_id(None, prefix).startswith(prefix)


NO_MARKS = AnswerFacts(max_tokens=100)
TAIL = AnswerFacts(max_tokens=100, uncached_tail=0.1)


@pytest.mark.parametrize("said, facts, expected", [
    ({"input_tokens": 30, "output_tokens": 2}, NO_MARKS, {"input_tokens": 30,
                                                         "output_tokens": 2}),
    ({"input_tokens": 3, "cache_read_input_tokens": 27, "output_tokens": 2}, NO_MARKS,
     {"input_tokens": 3, "cache_read_input_tokens": 27, "output_tokens": 2}),
    ({"input_tokens": 100, "output_tokens": 2}, TAIL,
     {"input_tokens": 10, "cache_creation_input_tokens": 90, "cache_read_input_tokens": 0,
      "output_tokens": 2}),
    ({"input_tokens": 12, "cache_read_input_tokens": 88, "output_tokens": 2}, TAIL,
     {"input_tokens": 10, "cache_creation_input_tokens": 2, "cache_read_input_tokens": 88,
      "output_tokens": 2}),
    ({"input_tokens": 5, "cache_read_input_tokens": 95, "output_tokens": 2}, TAIL,
     {"input_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 95,
      "output_tokens": 2}),
])
def test_usage_split_by_breakpoints(said: dict, facts: AnswerFacts, expected: dict) -> None:
    assert usage(said, facts) == expected


@pytest.mark.parametrize("reason, output, expected", [
    ("max_tokens", 100, "max_tokens"),  # the request's own limit
    ("max_tokens", 3, CONTEXT_FULL),  # llama.cpp stopped as its context filled
    ("end_turn", 3, "end_turn"),
    ("max_tokens", 0, "max_tokens"),  # a worker that counted nothing: nothing to tell
])
def test_a_full_context_is_told(reason: str, output: int, expected: str) -> None:
    told = {"input_tokens": 0 if output == 0 else 900, "output_tokens": output}
    assert stop_reason(reason, told, NO_MARKS) == expected


def test_a_whole_message_from_llama_cpp() -> None:
    told = tell_message({
        "id": "chatcmpl-abc", "type": "message", "content": [
            {"type": "text", "text": "x"},
            {"type": "tool_use", "id": "kS9", "name": "Bash", "input": {}}],
        "stop_reason": "max_tokens",
        "usage": {"cache_read_input_tokens": 24, "input_tokens": 997, "output_tokens": 3}},
        AnswerFacts(max_tokens=500))
    assert told["id"] == "msg_abc" and told["content"][1]["id"] == "toolu_kS9"
    assert told["stop_reason"] == CONTEXT_FULL
    assert told["usage"] == {"input_tokens": 997, "cache_read_input_tokens": 24,
                             "output_tokens": 3}


def sse(kind: str, data: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


async def pieces(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def events(raw: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in raw.decode().splitlines()
            if line.startswith("data: ")]


async def test_a_llama_cpp_stream_carries_its_usage_to_message_delta() -> None:
    stream = b"".join([
        sse("message_start", {"message": {"id": "chatcmpl-x", "content": [], "usage": {
            "cache_read_input_tokens": 28, "input_tokens": 3, "output_tokens": 0}}}),
        sse("content_block_start", {"index": 0, "content_block": {
            "type": "tool_use", "id": "Zq1", "name": "Bash", "input": {}}}),
        sse("content_block_stop", {"index": 0}),
        sse("message_delta", {"delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                              "usage": {"output_tokens": 5}}),
        sse("message_stop", {})])
    cut = [stream[i:i + 11] for i in range(0, len(stream), 11)]
    told = events(b"".join([c async for c in tell_events(pieces(*cut), AnswerFacts(500))]))
    assert told[1]["content_block"]["id"] == "toolu_Zq1"
    assert told[3]["delta"]["stop_reason"] == CONTEXT_FULL
    assert told[3]["usage"] == {"input_tokens": 3, "cache_read_input_tokens": 28,
                                "output_tokens": 5}


# --- Anthropic's words ----------------------------------------------------------------------

def too_long(message: str, **details: int) -> UpstreamError:
    error = UpstreamError(message, status_code=400, code="context_length_exceeded")
    error.details = details
    return error


@pytest.mark.parametrize("error, said", [
    (too_long("a: request (3031 tokens) exceeds the available context size (1024 tokens), "
              "try increasing it", n_prompt_tokens=3031, n_ctx=1024),
     "prompt is too long: 3031 tokens > 1024 maximum ('a' has the context its manifest's "
     "`ctx_size: 4096` gives it shared by 2 parallel slots; raise `ctx_size`"),
    (too_long("a: request (3031 tokens) exceeds the available context size (1024 tokens)"),
     "prompt is too long: 3031 tokens > 1024 maximum"),
    (too_long("a: This model's maximum context length is 8192 tokens. However, you requested "
              "9000 tokens (8990 in the messages, 10 in the completion)."),
     "prompt is too long: 8990 tokens > 8192 maximum"),
])
def test_a_prompt_too_long_in_anthropic_words(error: UpstreamError, said: str) -> None:
    told = in_anthropic_words(error, "a", lambda name: _Catalog().find(name).manifest)
    assert told.message.startswith(said), told.message
    assert told.status_code == 400


# --- in-process: the stream opens at once and pings while it waits --------------------------

MESSAGE = [sse("message_start", {"message": {"id": "chatcmpl-1", "type": "message",
                                             "role": "assistant", "content": [],
                                             "usage": {"input_tokens": 9,
                                                       "output_tokens": 0}}}),
           sse("content_block_start", {"index": 0, "content_block": {"type": "text",
                                                                     "text": ""}}),
           sse("content_block_delta", {"index": 0, "delta": {"type": "text_delta",
                                                             "text": "hi"}}),
           sse("content_block_stop", {"index": 0}),
           sse("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                 "usage": {"output_tokens": 1}}),
           sse("message_stop", {})]


@pytest.fixture
def llama_like(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """FakeBackend as llama.cpp's /v1/messages: a stream (or whole message) once its gate
    opens; its template refuses system turns when the model is named 'strict'."""
    seen: list[dict] = []

    async def handle(self, endpoint: str, body: dict, stream: bool) -> UpstreamResponse:
        seen.append(body)
        if self.gate is not None:
            await self.gate.wait()
        if self.entry.manifest.id == "strict" and any(
                m["role"] == "system" for m in body["messages"]):
            raise UpstreamError("strict: Jinja Exception: Conversation roles must alternate "
                                "user/assistant/user/assistant/...", status_code=400)
        if stream:
            return UpstreamResponse(200, {"content-type": "text/event-stream"},
                                    stream=pieces(*MESSAGE))
        return UpstreamResponse(200, {"content-type": "application/json"}, body=orjson.dumps({
            "id": "chatcmpl-1", "type": "message", "role": "assistant", "model": "file.gguf",
            "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 9, "output_tokens": 1}}))

    monkeypatch.setattr(FakeBackend, "handle_request", handle)
    monkeypatch.setattr(FakeBackend, "speaks_anthropic", True, raising=False)
    return seen


BODY = {"max_tokens": 20, "messages": [U, A, system("reminder"), U]}


async def test_the_stream_opens_then_pings_until_the_answer(tmp_path: Path, llama_like: list,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            ) -> None:
    monkeypatch.setenv(opening.PING_ENV, "0.05")
    gate = asyncio.Event()
    coord, _ = coordinator(tmp_path, [manifest("a", 1000)], backend_kwargs={"gate": gate})
    async with started_client(coord) as client:
        asyncio.get_running_loop().call_later(1.2, gate.set)
        response = await client.post("/v1/messages", json={**BODY, "model": "a",
                                                           "stream": True})
    assert response.status_code == 200 and response.headers["x-model-boss-model"] == "a"
    told = events(response.content)
    kinds = [e["type"] for e in told]
    assert kinds[:2] == ["message_start", "ping"]
    # every 0.05 s through a 1.2 s wait: 24 on time, at least 6 however late a busy box is
    assert kinds.count("ping") >= 6
    assert set(kinds[:-5]) == {"message_start", "ping"}
    assert kinds.count("message_start") == 1  # the worker's own is dropped
    assert kinds[-5:] == ["content_block_start", "content_block_delta", "content_block_stop",
                          "message_delta", "message_stop"]
    assert told[0]["message"]["id"].startswith("msg_") and told[0]["message"]["model"] == "a"
    assert told[-2]["usage"] == {"input_tokens": 9, "output_tokens": 1}
    assert llama_like[0]["messages"][2]["role"] == "system"  # a template that takes it


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_quick_refusal_keeps_its_status(tmp_path: Path, llama_like: list,
                                                streamed: bool) -> None:
    coord, _ = coordinator(tmp_path, [manifest("a", 1000)])
    async with started_client(coord) as client:
        response = await client.post("/v1/messages", json={**BODY, "model": "nope",
                                                           "stream": streamed})
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_template_that_refuses_system_turns_is_served_folded(
        tmp_path: Path, llama_like: list, streamed: bool) -> None:
    SYSTEM_TURNS._refusing.pop("strict", None)
    coord, _ = coordinator(tmp_path, [manifest("strict", 1000)])
    async with started_client(coord) as client:
        for _ in range(2):
            response = await client.post("/v1/messages", json={**BODY, "model": "strict",
                                                               "stream": streamed})
            assert response.status_code == 200, response.text
    if streamed:
        assert [e["type"] for e in events(response.content)][-1] == "message_stop"
    else:
        assert response.json()["content"] == [{"type": "text", "text": "hi"}]
        assert response.json()["id"] == "msg_1" and response.json()["model"] == "strict"
    # refused once, folded after: the second request goes folded at once
    assert [any(m["role"] == "system" for m in b["messages"]) for b in llama_like] == \
        [True, False, False]
    assert llama_like[-1]["messages"][-1]["content"][0]["text"] == \
        FOLD_OPEN + "reminder" + FOLD_CLOSE
    assert SYSTEM_TURNS.refuses("strict")
