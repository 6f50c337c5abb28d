"""Anthropic's Messages API ⇄ chat completions: the pure translation, told with tables."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest

from model_boss.services.anthropic.schemas import MessagesRequest
from model_boss.services.anthropic.stream import StreamFailed, from_chat_stream, native
from model_boss.services.anthropic.translate import count_answer, from_chat, to_chat
from model_boss.services.validation import parse

USER = {"role": "user", "content": "hi"}


def chat_of(**body) -> dict:
    """A body validated as the route validates it, then translated."""
    parsed = parse(MessagesRequest, {"max_tokens": 10, "messages": [USER], **body})
    return to_chat({**parsed.model_dump(exclude_unset=True), "model": "m"})


@pytest.mark.parametrize("body, expected", [
    ({}, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}),
    ({"system": "be brief"}, {"messages": [{"role": "system", "content": "be brief"},
                                           {"role": "user", "content": "hi"}]}),
    ({"system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
     {"messages": [{"role": "system", "content": "a\n\nb"},
                   {"role": "user", "content": "hi"}]}),
    ({"stop_sequences": ["\n\n"], "temperature": 0.5, "top_k": 3, "top_p": 0.9},
     {"stop": ["\n\n"], "temperature": 0.5, "top_k": 3, "top_p": 0.9}),
    ({"stream": True}, {"stream": True, "stream_options": {"include_usage": True}}),
    ({"thinking": {"type": "enabled", "budget_tokens": 2048}},
     {"chat_template_kwargs": {"enable_thinking": True}}),
    ({"thinking": {"type": "disabled"}}, {"chat_template_kwargs": {"enable_thinking": False}}),
])
def test_request_fields(body: dict, expected: dict) -> None:
    chat = chat_of(**body)
    assert {k: chat[k] for k in expected} == expected
    assert not {"system", "stop_sequences", "thinking", "metadata"} & set(chat)


TOOL = {"name": "get_weather", "input_schema": {"type": "object"}}


@pytest.mark.parametrize("choice, expected", [
    ({"type": "auto"}, "auto"),
    ({"type": "any"}, "required"),
    ({"type": "none"}, "none"),
    ({"type": "tool", "name": "get_weather"},
     {"type": "function", "function": {"name": "get_weather"}}),
])
def test_tool_choice(choice: dict, expected) -> None:
    chat = chat_of(tools=[TOOL], tool_choice=choice)
    assert chat["tool_choice"] == expected
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "", "parameters": {"type": "object"}}}]


def test_parallel_tool_use_can_be_turned_off() -> None:
    chat = chat_of(tools=[TOOL], tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert chat["parallel_tool_calls"] is False


def test_a_tool_round_trip_becomes_tool_calls_and_a_tool_message() -> None:
    chat = chat_of(messages=[
        USER,
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "look it up", "signature": "s"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1",
             "content": [{"type": "text", "text": "sunny"}]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "down",
             "is_error": True},
            {"type": "text", "text": "so?"}]}])
    assert chat["messages"][1:] == [
        {"role": "assistant", "content": "Checking.", "reasoning_content": "look it up",
         "tool_calls": [{"id": "toolu_1", "type": "function", "function": {
             "name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: down"},
        {"role": "user", "content": "so?"}]


def test_images_become_image_url_parts() -> None:
    chat = chat_of(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "AAAA"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        {"type": "text", "text": "what?"}]}])
    assert chat["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {"type": "text", "text": "what?"}]


def completion(message: dict, finish: str) -> bytes:
    return orjson.dumps({"choices": [{"message": message, "finish_reason": finish}],
                         "usage": {"prompt_tokens": 5, "completion_tokens": 2}})


@pytest.mark.parametrize("message, finish, content, stop", [
    ({"content": "hello"}, "stop", [{"type": "text", "text": "hello"}], "end_turn"),
    ({"content": "hel"}, "length", [{"type": "text", "text": "hel"}], "max_tokens"),
    ({"content": None, "tool_calls": [{"id": "c1", "function": {
        "name": "f", "arguments": '{"a": 1}'}}]}, "tool_calls",
     [{"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}}], "tool_use"),
    ({"content": "ok", "reasoning_content": "hmm"}, "stop",
     [{"type": "thinking", "thinking": "hmm", "signature": ""},
      {"type": "text", "text": "ok"}], "end_turn"),
    ({"content": "no"}, "content_filter", [{"type": "text", "text": "no"}], "refusal"),
])
def test_answers(message: dict, finish: str, content: list, stop: str) -> None:
    answer = orjson.loads(from_chat(completion(message, finish), "m"))
    assert answer["content"] == content and answer["stop_reason"] == stop
    assert answer["type"] == "message" and answer["model"] == "m"
    assert answer["usage"] == {"input_tokens": 5, "output_tokens": 2}


STOPS = ["\n\n", "END"]


@pytest.mark.parametrize("choice, text, stop_reason, stop_sequence", [
    # finish_reason "stop" either way: the model's own end...
    ({"finish_reason": "stop"}, "hello", "end_turn", None),
    # ...or the server names the stop string (vLLM, SGLang, llama.cpp)...
    ({"finish_reason": "stop", "stop_reason": "END"}, "hello", "stop_sequence", "END"),
    ({"finish_reason": "stop", "matched_stop": "\n\n"}, "hello", "stop_sequence", "\n\n"),
    ({"finish_reason": "stop", "stop_reason": 2}, "hello", "end_turn", None),  # a token id
    ({"finish_reason": "stop", "stopping_word": "other"}, "hello", "end_turn", None),
    # ...or it kept the stop string in the text: cut off, as Anthropic leaves it out
    ({"finish_reason": "stop"}, "helloEND", "stop_sequence", "END"),
    ({"finish_reason": "length"}, "helloEND", "max_tokens", None),
])
def test_a_stop_sequence_that_ended_the_answer(choice: dict, text: str, stop_reason: str,
                                               stop_sequence: str | None) -> None:
    raw = orjson.dumps({"choices": [{"message": {"content": text}, **choice}]})
    answer = orjson.loads(from_chat(raw, "m", STOPS))
    assert (answer["stop_reason"], answer["stop_sequence"]) == (stop_reason, stop_sequence)
    kept = text if stop_reason != "stop_sequence" else text.removesuffix(stop_sequence)
    assert answer["content"] == [{"type": "text", "text": kept}]
    # without stop_sequences in the request, never
    assert orjson.loads(from_chat(raw, "m"))["stop_sequence"] is None


def test_count_tokens_reads_the_prompt_tokens() -> None:
    assert orjson.loads(count_answer(completion({"content": "x"}, "length"))) == \
        {"input_tokens": 5}


async def pieces(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def sse(chunk: dict) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def delta(**fields) -> dict:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


async def events_of(stream: AsyncIterator[bytes]) -> list[dict]:
    raw = b"".join([chunk async for chunk in stream])
    out = []
    for whole in raw.split(b"\n\n"):
        lines = whole.split(b"\n")
        if lines[0].startswith(b"event: "):
            data = orjson.loads(lines[1][6:])
            assert data["type"] == lines[0][7:].decode()
            out.append(data)
    return out


async def test_a_chat_stream_as_message_events() -> None:
    whole = b"".join([
        sse(delta(reasoning_content="thinking...")), sse(delta(content="Hel")),
        sse(delta(content="lo")),
        sse(delta(tool_calls=[{"index": 0, "id": "c1", "function": {"name": "f",
                                                                    "arguments": '{"a"'}}])),
        sse(delta(tool_calls=[{"index": 0, "function": {"arguments": ": 1}"}}])),
        sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        sse({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}),
        b"data: [DONE]\n\n"])
    cut = [whole[i:i + 7] for i in range(0, len(whole), 7)]  # cut anywhere, even mid-event
    events = await events_of(from_chat_stream(pieces(*cut), "m"))
    kinds = [e["type"] for e in events]
    assert kinds == ["message_start", "ping",
                     "content_block_start", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]
    assert events[2]["content_block"]["type"] == "thinking"
    assert events[3]["delta"] == {"type": "thinking_delta", "thinking": "thinking..."}
    assert [e["delta"]["text"] for e in events[6:8]] == ["Hel", "lo"]
    assert events[9]["content_block"] == {"type": "tool_use", "id": "c1", "name": "f",
                                          "input": {}}
    assert "".join(e["delta"]["partial_json"] for e in events[10:12]) == '{"a": 1}'
    assert [e["index"] for e in events if e["type"] == "content_block_start"] == [0, 1, 2]
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    assert events[-2]["usage"] == {"input_tokens": 9, "output_tokens": 4}


@pytest.mark.parametrize("deltas, last, text, stop_reason, stop_sequence", [
    (["Hel", "lo"], {}, "Hello", "end_turn", None),
    (["Hel", "lo"], {"stop_reason": "END"}, "Hello", "stop_sequence", "END"),
    (["Hello\n", "\n"], {}, "Hello", "stop_sequence", "\n\n"),  # kept by the server
    (["Hello\n", "there"], {}, "Hello\nthere", "end_turn", None),  # held, then let go
    (["Hello E", "N", "D"], {}, "Hello ", "stop_sequence", "END"),
])
async def test_a_stream_ended_by_a_stop_sequence(deltas: list, last: dict, text: str,
                                                 stop_reason: str,
                                                 stop_sequence: str | None) -> None:
    chunks = [sse(delta(content=d)) for d in deltas]
    chunks.append(sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop",
                                    **last}]}))
    events = await events_of(from_chat_stream(pieces(*chunks, b"data: [DONE]\n\n"), "m",
                                              STOPS))
    said = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert said == text
    end = next(e for e in events if e["type"] == "message_delta")["delta"]
    assert end == {"stop_reason": stop_reason, "stop_sequence": stop_sequence}


async def test_an_error_chunk_fails_the_stream() -> None:
    stream = from_chat_stream(pieces(sse(delta(content="a")),
                                     sse({"error": {"message": "out of memory"}})), "m")
    with pytest.raises(StreamFailed, match="out of memory"):
        await events_of(stream)


MESSAGE_START = (b'event: message_start\ndata: {"type":"message_start","message":'
                 b'{"id":"x","model":"m","content":[]}}\n\n')
BLOCK_START = (b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
               b'"content_block":{"type":"text","text":""}}\n\n')


@pytest.mark.parametrize("parts", [
    (MESSAGE_START + BLOCK_START,),
    (MESSAGE_START[:20], MESSAGE_START[20:] + BLOCK_START[:5], BLOCK_START[5:]),
])
async def test_native_stream_gets_a_ping_after_message_start(parts: tuple) -> None:
    kinds = [e["type"] for e in await events_of(native(pieces(*parts), "m"))]
    assert kinds == ["message_start", "ping", "content_block_start"]


async def test_native_stream_without_message_start_gets_one() -> None:
    """llama.cpp leaves it out when the first token is part of a multi-byte character."""
    events = await events_of(native(pieces(BLOCK_START), "m"))
    assert [e["type"] for e in events] == ["message_start", "ping", "content_block_start"]
    assert events[0]["message"]["model"] == "m"
