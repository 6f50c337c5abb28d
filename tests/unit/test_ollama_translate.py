"""The pure Ollama translation: keep_alive, options, format, names, messages, answers and
the SSE → NDJSON stream, with tables."""

from __future__ import annotations

import json

import orjson
import pytest

from model_boss.errors import BadRequest
from model_boss.services.ollama.schemas import OllamaMessage, OllamaOptions
from model_boss.services.ollama.service import shorten, whole_answer
from model_boss.services.ollama.stream import NdjsonStream, sse_payloads
from model_boss.services.ollama.translate import (
    JSON_GRAMMAR,
    final_fields,
    format_params,
    name_variants,
    openai_messages,
    parse_keep_alive,
    resolve_name,
    worker_params,
)


@pytest.mark.parametrize("value, seconds", [
    (None, None), ("", None), (0, 0.0), ("0", 0.0), ("0s", 0.0), (300, 300.0), (1.5, 1.5),
    ("300", 300.0), ("5m", 300.0), ("1h30m", 5400.0), ("300ms", 0.3), ("2h", 7200.0),
    ("1.5h", 5400.0), ("10s", 10.0), ("-1", -1.0), (-1, -1.0), (-5, -1.0), ("-5m", -1.0),
    ("-1ns", -1.0), ("+30s", 30.0), ("720h", 2_592_000.0),
])
def test_keep_alive_durations(value, seconds):
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["5 minutes", "m5", "5x", "abc", "5m3", "1d", "721h"])
def test_keep_alive_that_is_no_duration_or_too_long_is_a_400(value):
    with pytest.raises(BadRequest) as refused:
        parse_keep_alive(value)
    assert refused.value.param == "keep_alive" and refused.value.status_code == 400


@pytest.mark.parametrize("options, params", [
    ({}, {}),
    ({"num_predict": 8}, {"max_tokens": 8}),
    ({"num_predict": -1}, {}), ({"num_predict": -2}, {}),
    ({"temperature": 0.2, "top_p": 0.9, "top_k": 40, "min_p": 0.05},
     {"temperature": 0.2, "top_p": 0.9, "top_k": 40, "min_p": 0.05}),
    ({"seed": 7, "stop": ["\n", "END"], "repeat_penalty": 1.1, "repeat_last_n": 64},
     {"seed": 7, "stop": ["\n", "END"], "repeat_penalty": 1.1, "repeat_last_n": 64}),
    ({"presence_penalty": 0.5, "frequency_penalty": 0.3, "typical_p": 0.9},
     {"presence_penalty": 0.5, "frequency_penalty": 0.3, "typical_p": 0.9}),
    ({"num_keep": 4, "mirostat": 2, "mirostat_tau": 5.0, "mirostat_eta": 0.1},
     {"n_keep": 4, "mirostat": 2, "mirostat_tau": 5.0, "mirostat_eta": 0.1}),
    ({"num_ctx": 1024}, {}), ({"num_ctx": 512}, {}),
    ({"num_gpu": 99, "num_thread": 8, "use_mmap": False, "low_vram": True}, {}),
])
def test_options_become_worker_fields(options, params):
    assert worker_params(OllamaOptions.model_validate(options), 1024, "m") == params


def test_no_options_no_fields():
    assert worker_params(None, 1024, "m") == {}


def test_num_ctx_beyond_the_manifest_is_a_400_naming_it():
    with pytest.raises(BadRequest) as refused:
        worker_params(OllamaOptions(num_ctx=4096), 1024, "smol")
    message = refused.value.message
    assert refused.value.param == "options.num_ctx" and "1024" in message and "smol" in message
    assert refused.value.code == "context_too_large"


@pytest.mark.parametrize("fmt, chat, params", [
    (None, True, {}), ("", True, {}), (None, False, {}),
    ("json", True, {"grammar": JSON_GRAMMAR}), ("json", False, {"grammar": JSON_GRAMMAR}),
    ({"type": "object"}, True, {"response_format": {"type": "json_schema", "json_schema": {
        "name": "format", "schema": {"type": "object"}}}}),
    ({"type": "object"}, False, {"json_schema": {"type": "object"}}),
])
def test_format(fmt, chat, params):
    assert format_params(fmt, chat=chat) == params


@pytest.mark.parametrize("name, variants", [
    ("smollm2", ["smollm2", "smollm2:latest"]),
    ("smollm2:latest", ["smollm2:latest", "smollm2"]),
    ("smollm2:135m", ["smollm2:135m"]),
    ("task:chat", ["task:chat", "task:chat:latest"]),
    ("task:chat:latest", ["task:chat:latest", "task:chat"]),
])
def test_name_variants(name, variants):
    assert name_variants(name) == variants


@pytest.mark.parametrize("name, known, resolved", [
    ("smollm2:latest", {"smollm2"}, "smollm2"),
    ("smollm2", {"smollm2:latest"}, "smollm2:latest"),
    ("smollm2:135m", {"smollm2:135m"}, "smollm2:135m"),
    ("smollm2", {"smollm2", "smollm2:latest"}, "smollm2"),  # as given wins
    ("task:chat:latest", {"task:chat"}, "task:chat"),
    ("nope", {"smollm2"}, "nope"),  # unknown stays: the router answers 404
])
def test_resolve_name(name, known, resolved):
    assert resolve_name(name, known.__contains__) == resolved


def test_messages_images_and_tool_calls():
    messages = [
        OllamaMessage(role="user", content="what is it?", images=["iVBORw0KGgo="]),
        OllamaMessage(role="assistant", content="",
                      tool_calls=[{"function": {"name": "f", "arguments": {"x": 1}}}]),
        OllamaMessage(role="tool", content="42", tool_name="f"),
    ]
    out = openai_messages(messages, vision=True, model_id="v")
    assert out[0]["content"] == [
        {"type": "text", "text": "what is it?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]
    call = out[1]["tool_calls"][0]
    assert call["function"] == {"name": "f", "arguments": '{"x":1}'}
    assert call["type"] == "function" and call["id"]
    assert out[2] == {"role": "tool", "content": "42", "name": "f"}


def test_images_for_a_model_that_cannot_see_are_a_400():
    with pytest.raises(BadRequest) as refused:
        openai_messages([OllamaMessage(role="user", content="x", images=["/9j/"])],
                        vision=False, model_id="smol")
    assert refused.value.code == "images_not_supported" and "smol" in refused.value.message
    assert refused.value.param == "messages.0.images"


@pytest.mark.parametrize("reason, done", [("stop", "stop"), ("length", "length"),
                                          ("tool_calls", "stop"), (None, "stop")])
def test_final_fields(reason, done):
    fields = final_fields(reason, {"prompt_tokens": 30, "completion_tokens": 8},
                          {"prompt_ms": 12.5, "predicted_ms": 80.0, "prompt_n": 3,
                           "predicted_n": 8}, total_s=0.5, waited_s=0.25)
    assert fields == {"done": True, "done_reason": done, "total_duration": 500_000_000,
                      "load_duration": 250_000_000, "prompt_eval_count": 30,
                      "prompt_eval_duration": 12_500_000, "eval_count": 8,
                      "eval_duration": 80_000_000}


def test_final_fields_without_usage_count_from_timings():
    fields = final_fields("stop", None, {"prompt_n": 3, "predicted_n": 5}, 0, 0)
    assert (fields["prompt_eval_count"], fields["eval_count"]) == (3, 5)


def test_whole_answers():
    data = {"choices": [{"message": {"role": "assistant", "content": "hi",
                                     "tool_calls": [{"function": {
                                         "name": "f", "arguments": '{"a": 2}'}}]},
                         "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
    chat = whole_answer(data, "chat", "smol:latest", 1.0, 0.0)
    assert chat["model"] == "smol:latest" and chat["done"] and chat["done_reason"] == "stop"
    assert chat["message"] == {"role": "assistant", "content": "hi",
                               "tool_calls": [{"function": {"name": "f",
                                                            "arguments": {"a": 2}}}]}
    raw = whole_answer({"choices": [{"text": "abc", "finish_reason": "length"}]},
                       "generate", "smol", 1.0, 0.0)
    assert raw["response"] == "abc" and raw["done_reason"] == "length"


def test_sse_payloads_split_events_across_chunks():
    buffer = bytearray(b'data: {"a": 1}\n\n: comment\n\ndata: {"b"')
    assert sse_payloads(buffer) == [b'{"a": 1}']
    buffer.extend(b': 2}\r\n\r\ndata: [DONE]\n\n')
    assert sse_payloads(buffer) == [b'{"b": 2}', b"[DONE]"]
    assert bytes(buffer) == b""


async def _lines(shape, chunks):
    async def source():
        for chunk in chunks:
            yield chunk

    stream = NdjsonStream(shape, "smol", started=0.0, waited_s=0.0)
    return [json.loads(line) async for line in stream.translate(source())]


def _sse(event) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


async def test_stream_of_chat_chunks_ends_with_the_counts():
    chunks = [_sse({"choices": [{"delta": {"role": "assistant", "content": ""}}]}),
              _sse({"choices": [{"delta": {"content": "Hel"}}]})[:9],
              _sse({"choices": [{"delta": {"content": "Hel"}}]})[9:],
              _sse({"choices": [{"delta": {"content": "lo"}, "finish_reason": "length"}],
                    "timings": {"prompt_ms": 2.0, "predicted_ms": 4.0}}),
              _sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}),
              b"data: [DONE]\n\n"]
    lines = await _lines("chat", chunks)
    assert [line["message"]["content"] for line in lines] == ["Hel", "lo", ""]
    assert [line["done"] for line in lines] == [False, False, True]
    last = lines[-1]
    assert last["done_reason"] == "length" and last["eval_count"] == 2
    assert last["prompt_eval_count"] == 5 and last["eval_duration"] == 4_000_000


async def test_stream_of_completion_chunks_is_generate_shaped():
    lines = await _lines("generate", [_sse({"choices": [{"text": "a"}]}),
                                      _sse({"choices": [{"text": "b", "finish_reason": "stop"}]})])
    assert [line["response"] for line in lines] == ["a", "b", ""]
    assert lines[-1]["done_reason"] == "stop"


async def test_streamed_tool_calls_arrive_whole():
    part = {"index": 0, "function": {"name": "get", "arguments": '{"ci'}}
    rest = {"index": 0, "function": {"arguments": 'ty": "Paris"}'}}
    lines = await _lines("chat", [_sse({"choices": [{"delta": {"tool_calls": [part]}}]}),
                                  _sse({"choices": [{"delta": {"tool_calls": [rest]},
                                                     "finish_reason": "tool_calls"}]})])
    assert lines[0]["message"]["tool_calls"] == [
        {"function": {"name": "get", "arguments": {"city": "Paris"}}}]
    assert lines[-1]["done"] and lines[-1]["done_reason"] == "stop"


async def test_an_error_event_becomes_an_ollama_error_line():
    lines = await _lines("chat", [_sse({"choices": [{"delta": {"content": "x"}}]}),
                                  _sse({"error": {"message": "worker for 'a' exited",
                                                  "code": "worker_failed"}}),
                                  b"data: [DONE]\n\n"])
    assert lines[-1] == {"error": "worker for 'a' exited"}
    assert not any(line.get("done") for line in lines)


@pytest.mark.parametrize("vector, n, expected", [
    ([3.0, 4.0, 12.0], 2, [0.6, 0.8]), ([1.0, 0.0], 5, [1.0, 0.0]), ([0.0, 0.0, 1.0], 2,
                                                                      [0.0, 0.0])])
def test_shortened_embeddings_are_unit_length(vector, n, expected):
    assert shorten(vector, n) == pytest.approx(expected)


async def test_a_client_that_leaves_mid_stream_closes_the_worker_stream():
    closed = []

    async def source():
        try:
            for piece in ("a", "b", "c"):
                yield _sse({"choices": [{"delta": {"content": piece}}]})
        finally:
            closed.append(True)  # the relay releases the slot ticket here

    lines = NdjsonStream("chat", "smol", 0.0, 0.0).translate(source())
    assert json.loads(await anext(lines))["message"]["content"] == "a"
    await lines.aclose()
    assert closed == [True]
