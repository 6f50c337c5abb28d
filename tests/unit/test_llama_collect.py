"""A non-streamed llama.cpp answer gathered from its stream: the whole body each shape adds
up to, however the bytes were cut."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest

from model_boss.backends.llama.collect import as_stream, collect, collectable
from model_boss.errors import UpstreamError


async def cut(raw: bytes, size: int = 5) -> AsyncIterator[bytes]:
    for i in range(0, len(raw), size):
        yield raw[i:i + size]


def sse(*datas: dict, done: bool = True) -> bytes:
    out = b"".join(b"data: " + orjson.dumps(d) + b"\n\n" for d in datas)
    return out + (b"data: [DONE]\n\n" if done else b"")


def event(data: dict) -> bytes:
    return b"event: " + data["type"].encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


async def whole(endpoint: str, raw: bytes) -> dict:
    return orjson.loads(await collect(endpoint, cut(raw), "m"))


@pytest.mark.parametrize("endpoint, body, expected", [
    ("/completion", {}, True), ("/v1/chat/completions", {}, True),
    ("/v1/messages", {}, True), ("/v1/completions", {"logprobs": 2}, True),
    ("/v1/responses", {}, True),
    ("/v1/embeddings", {}, False), ("/tokenize", {}, False),
])
def test_what_is_gathered(endpoint: str, body: dict, expected: bool) -> None:
    assert collectable(endpoint, body) is expected


def test_the_stream_asks_for_usage() -> None:
    assert as_stream("/v1/chat/completions", {"stream_options": {"x": 1}}) == {
        "stream": True, "stream_options": {"x": 1, "include_usage": True}}
    assert as_stream("/completion", {"n_predict": 3}) == {"n_predict": 3, "stream": True}


async def test_native_completion() -> None:
    answer = await whole("/completion", sse(
        {"content": "Hel", "tokens": [1], "stop": False},
        {"content": "lo", "tokens": [2], "stop": False},
        {"content": "", "tokens": [], "stop": True, "tokens_predicted": 2,
         "timings": {"predicted_n": 2}}, done=False))
    assert answer == {"content": "Hello", "tokens": [1, 2], "stop": True,
                      "tokens_predicted": 2, "timings": {"predicted_n": 2}}


async def test_chat_with_reasoning_and_tool_calls() -> None:
    frame = {"id": "c1", "created": 7, "model": "m", "object": "chat.completion.chunk"}
    answer = await whole("/v1/chat/completions", sse(
        {**frame, "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        {**frame, "choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]},
        {**frame, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "t1", "function": {"name": "f", "arguments": '{"a"'}}]}}]},
        {**frame, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": ": 1}"}}]}}]},
        {**frame, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {**frame, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}))
    assert answer == {
        "id": "c1", "object": "chat.completion", "created": 7, "model": "m",
        "usage": {"prompt_tokens": 3, "completion_tokens": 4},
        "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None,
                     "message": {"role": "assistant", "content": None,
                                 "reasoning_content": "hm", "tool_calls": [{
                                     "id": "t1", "type": "function",
                                     "function": {"name": "f", "arguments": '{"a": 1}'}}]}}]}


async def test_text_completion() -> None:
    answer = await whole("/v1/completions", sse(
        {"id": "x", "choices": [{"index": 0, "text": "a"}]},
        {"id": "x", "choices": [{"index": 0, "text": "b", "finish_reason": "length"}]}))
    assert answer["object"] == "text_completion"
    assert answer["choices"] == [{"index": 0, "text": "ab", "logprobs": None,
                                  "finish_reason": "length"}]


async def test_text_completion_with_logprobs() -> None:
    one = {"id": 1, "token": "a", "logprob": -0.5, "top_logprobs": []}
    two = {"id": 2, "token": "b", "logprob": -1.5, "top_logprobs": []}
    answer = await whole("/v1/completions", sse(
        {"id": "x", "choices": [{"index": 0, "text": "a", "logprobs": {"content": [one]}}]},
        {"id": "x", "choices": [{"index": 0, "text": "b", "logprobs": {"content": [two]}}]},
        {"id": "x", "choices": [{"index": 0, "text": "", "logprobs": None,
                                 "finish_reason": "length"}]}))
    assert answer["choices"] == [{"index": 0, "text": "ab", "finish_reason": "length",
                                  "logprobs": {"content": [one, two]}}]


RESPONSE = {"id": "resp_1", "object": "response", "created_at": 7, "status": "completed",
            "model": "m", "output": [{"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "Hi", "annotations": []}]}],
            "usage": {"input_tokens": 3, "output_tokens": 1, "total_tokens": 4}}


async def test_a_response_is_the_one_its_completed_event_carries() -> None:
    answer = await whole("/v1/responses", b"".join([
        event({"type": "response.created", "response": {"id": "resp_1"}}),
        event({"type": "response.output_text.delta", "item_id": "i", "delta": "Hi"}),
        event({"type": "response.completed", "response": RESPONSE})]))
    assert answer.pop("completed_at") >= 7
    assert answer == RESPONSE


async def test_a_response_that_failed_or_never_completed_is_an_error() -> None:
    with pytest.raises(UpstreamError) as failed:
        await whole("/v1/responses", event({"type": "error", "error": {
            "code": 400, "message": "context full", "type": "exceed_context_size_error"}}))
    assert failed.value.status_code == 400
    with pytest.raises(UpstreamError) as cut_short:
        await whole("/v1/responses", event({"type": "response.created", "response": {}}))
    assert cut_short.value.status_code == 502


async def test_message_without_its_message_start() -> None:
    answer = await whole("/v1/messages", b"".join([
        event({"type": "content_block_start", "index": 0,
               "content_block": {"type": "text", "text": ""}}),
        event({"type": "content_block_delta", "index": 0,
               "delta": {"type": "text_delta", "text": "Hi"}}),
        event({"type": "content_block_stop", "index": 0}),
        event({"type": "content_block_start", "index": 1, "content_block": {
            "type": "tool_use", "id": "t", "name": "f", "input": {}}}),
        event({"type": "content_block_delta", "index": 1,
               "delta": {"type": "input_json_delta", "partial_json": '{"a": '}}),
        event({"type": "content_block_delta", "index": 1,
               "delta": {"type": "input_json_delta", "partial_json": "1}"}}),
        event({"type": "message_delta", "delta": {"stop_reason": "tool_use"},
               "usage": {"output_tokens": 5}}),
        event({"type": "message_stop"})]))
    assert answer["model"] == "m" and answer["stop_reason"] == "tool_use"
    assert answer["content"] == [{"type": "text", "text": "Hi"},
                                 {"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}]
    assert answer["usage"] == {"input_tokens": 0, "output_tokens": 5}


async def test_an_error_in_the_stream_is_the_workers_error() -> None:
    with pytest.raises(UpstreamError) as failed:
        await whole("/completion", sse({"content": "a"}, {"error": {
            "code": 400, "message": "context full", "type": "exceed_context_size_error"}}))
    assert failed.value.status_code == 400
    assert failed.value.error_type == "exceed_context_size_error"
