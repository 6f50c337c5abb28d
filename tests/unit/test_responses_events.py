"""llama.cpp's Responses stream told as OpenAI's spec tells it (services/responses/events.py).

The ``llama_responses/*.sse`` files are llama.cpp's own streams, recorded from the server in
the ``xllamacpp`` wheel on SmolLM2 (``/v1/responses``, ``stream: true``): plain text; a
thinking template whose reasoning the model ends and then answers (llama.cpp keeps the
reasoning item open while the message starts); reasoning only (cut by max_output_tokens);
two tool calls with a Hermes-style template (the second cut short)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from model_boss.services.responses import ResponsesStream, told

RECORDED = Path(__file__).parent / "llama_responses"
# the events sent for each recording: (type less "response.", output_index, content_index),
# then how many times in a row
TOLD = {
    "text": [
        ("created", None, None), ("in_progress", None, None), ("output_item.added", 0, None),
        ("content_part.added", 0, 0), (("output_text.delta", 0, 0), 6),
        ("output_text.done", 0, 0), ("content_part.done", 0, 0), ("output_item.done", 0, None),
        ("completed", None, None)],
    "reasoning_then_text": [
        ("created", None, None), ("in_progress", None, None), ("output_item.added", 0, None),
        ("content_part.added", 0, 0), (("reasoning_text.delta", 0, 0), 8),
        ("output_item.added", 1, None), ("content_part.added", 1, 0),
        (("output_text.delta", 1, 0), 12), ("reasoning_text.done", 0, 0),
        ("content_part.done", 0, 0), ("output_item.done", 0, None),
        ("output_text.done", 1, 0), ("content_part.done", 1, 0), ("output_item.done", 1, None),
        ("completed", None, None)],
    "reasoning_only": [
        ("created", None, None), ("in_progress", None, None), ("output_item.added", 0, None),
        ("content_part.added", 0, 0), (("reasoning_text.delta", 0, 0), 23),
        ("reasoning_text.done", 0, 0), ("content_part.done", 0, 0),
        ("output_item.done", 0, None), ("completed", None, None)],
    "two_tool_calls": [
        ("created", None, None), ("in_progress", None, None), ("output_item.added", 0, None),
        (("function_call_arguments.delta", 0, None), 8), ("output_item.added", 1, None),
        (("function_call_arguments.delta", 1, None), 6),
        ("function_call_arguments.done", 0, None), ("output_item.done", 0, None),
        ("function_call_arguments.done", 1, None), ("output_item.done", 1, None),
        ("completed", None, None)],
}
# events whose spec has an output_index, and those that also have a content_index
ITEM_EVENTS = ("response.output_item.", "response.content_part.", "response.output_text.",
               "response.reasoning_text.", "response.function_call_arguments.")
PART_EVENTS = ("response.content_part.", "response.output_text.", "response.reasoning_text.")


def _told(raw: bytes, model_id: str = "smol") -> list[dict[str, Any]]:
    async def chunks():
        for start in range(0, len(raw), 97):  # cut anywhere: events span chunks
            yield raw[start:start + 97]

    async def run() -> bytes:
        return b"".join([chunk async for chunk in told(chunks(), model_id)])

    out = asyncio.run(run())
    events = []
    for whole in out.split(b"\n\n"):
        lines = whole.split(b"\n")
        if len(lines) == 2 and lines[1].startswith(b"data: "):
            event = orjson.loads(lines[1][6:])
            assert lines[0] == b"event: " + event["type"].encode()
            events.append(event)
    return events


def _runs(events: list[dict[str, Any]]) -> list[Any]:
    runs: list[list[Any]] = []
    for event in events:
        row = (event["type"].removeprefix("response."), event.get("output_index"),
               event.get("content_index"))
        if runs and runs[-1][0] == row:
            runs[-1][1] += 1
        else:
            runs.append([row, 1])
    return [(row, count) if count > 1 else row for row, count in runs]


@pytest.mark.parametrize("name", sorted(TOLD))
def test_a_recorded_stream_is_told_numbered_and_indexed(name: str) -> None:
    events = _told((RECORDED / f"{name}.sse").read_bytes())
    assert _runs(events) == TOLD[name]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        if event["type"].startswith(ITEM_EVENTS):
            assert isinstance(event["output_index"], int), event
        if event["type"].startswith(PART_EVENTS):
            assert isinstance(event["content_index"], int), event


@pytest.mark.parametrize("name", sorted(TOLD))
def test_the_last_response_lists_the_items_the_stream_told(name: str) -> None:
    events = _told((RECORDED / f"{name}.sse").read_bytes())
    done = {e["output_index"]: e["item"] for e in events
            if e["type"] == "response.output_item.done"}
    response = events[-1]["response"]
    assert response["id"].startswith("resp_") and response["model"] == "smol"
    assert response["output"] == [done[i] for i in sorted(done)]
    assert all(item["id"] and item["status"] == "completed" for item in response["output"])
    added = [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
    assert [item["id"] for item in response["output"]] == added
    assert response["usage"]["input_tokens_details"]["cached_tokens"] >= 0
    opening = events[0]["response"]
    assert opening["id"] == response["id"] and opening["output"] == []
    assert opening["status"] == "in_progress" and opening["created_at"] > 0


def test_closing_events_carry_the_whole_text_and_arguments() -> None:
    events = _told((RECORDED / "reasoning_then_text.sse").read_bytes())
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    done = next(e for e in events if e["type"] == "response.reasoning_text.done")
    assert done["text"] == deltas and done["item_id"].startswith("rs_")
    part = next(e for e in events if e["type"] == "response.content_part.done"
                and e["output_index"] == 0)
    assert part["part"] == {"type": "reasoning_text", "text": deltas}
    reasoning = events[-1]["response"]["output"][0]
    assert reasoning["type"] == "reasoning" and reasoning["content"][0]["text"] == deltas
    usage = events[-1]["response"]["usage"]
    assert usage["output_tokens_details"]["reasoning_tokens"] == 8  # one delta per token
    calls = _told((RECORDED / "two_tool_calls.sse").read_bytes())
    for index in (0, 1):
        arguments = "".join(e["delta"] for e in calls if e.get("output_index") == index
                            and e["type"] == "response.function_call_arguments.delta")
        closing = next(e for e in calls if e.get("output_index") == index
                       and e["type"] == "response.function_call_arguments.done")
        assert closing["arguments"] == arguments and closing["name"] == "get_weather"
    assert calls[-1]["response"]["output"][0]["arguments"] == '{"city": "Paris"}'


def test_message_parts_carry_annotations_and_logprobs() -> None:
    events = _told((RECORDED / "text.sse").read_bytes())
    for event in events:
        if event["type"] in ("response.output_text.delta", "response.output_text.done"):
            assert event["logprobs"] == []
        if event["type"].startswith("response.content_part."):
            assert event["part"]["annotations"] == [] and event["part"]["logprobs"] == []


def feed_all(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    stream = ResponsesStream("m")
    return [sent for event in events for sent in stream.feed(event)]


def test_an_older_server_names_a_call_only_by_its_call_id() -> None:
    """llama.cpp before items had ids: a function call's item has ``call_id: fc_…`` only,
    its argument deltas name that, and its whole response lists the call without an id."""
    call = {"type": "function_call", "call_id": "fc_1", "name": "f", "arguments": "",
            "status": "in_progress"}
    final = {**call, "arguments": '{"a": 1}', "status": "completed"}
    sent = feed_all([
        {"type": "response.created", "response": {"id": "resp_x", "status": "in_progress"}},
        {"type": "response.output_item.added", "item": call},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "delta": "{\"a"},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "delta": "\": 1}"},
        {"type": "response.output_item.done", "item": {k: v for k, v in final.items()}},
        {"type": "response.completed", "response": {"id": "resp_x", "output": [final]}}])
    assert [(e["type"], e.get("output_index")) for e in sent] == [
        ("response.created", None), ("response.output_item.added", 0),
        ("response.function_call_arguments.delta", 0),
        ("response.function_call_arguments.delta", 0),
        ("response.function_call_arguments.done", 0), ("response.output_item.done", 0),
        ("response.completed", None)]
    assert sent[1]["item"]["id"] == "fc_1" and sent[4]["arguments"] == '{"a": 1}'
    assert sent[-1]["response"]["output"][0]["id"] == "fc_1"


# a stream already as OpenAI's spec has it: told again, the same (no event added twice)
SPEC_STREAM = [
    {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}},
    {"type": "response.output_item.added", "output_index": 0,
     "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": []}},
    {"type": "response.content_part.added", "item_id": "msg_1", "output_index": 0,
     "content_index": 0, "part": {"type": "output_text", "text": ""}},
    {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
     "content_index": 0, "delta": "Hi"},
    {"type": "response.output_text.done", "item_id": "msg_1", "output_index": 0,
     "content_index": 0, "text": "Hi"},
    {"type": "response.content_part.done", "item_id": "msg_1", "output_index": 0,
     "content_index": 0, "part": {"type": "output_text", "text": "Hi"}},
    {"type": "response.output_item.done", "output_index": 0, "item": {
        "type": "message", "id": "msg_1", "role": "assistant",
        "content": [{"type": "output_text", "text": "Hi"}]}},
    {"type": "response.completed", "response": {"id": "resp_1", "output": [{
        "type": "message", "id": "msg_1", "role": "assistant",
        "content": [{"type": "output_text", "text": "Hi"}]}]}}]


def test_a_stream_that_says_everything_gains_only_numbers() -> None:
    sent = feed_all([dict(e, sequence_number=99) for e in SPEC_STREAM])
    assert [e["type"] for e in sent] == [e["type"] for e in SPEC_STREAM]
    assert [e["sequence_number"] for e in sent] == list(range(len(SPEC_STREAM)))
    assert all(e.get("output_index") in (None, 0) for e in sent)


@pytest.mark.parametrize(("events", "told_types"), [
    # a delta for an item never added: added first (with its part)
    ([{"type": "response.output_text.delta", "item_id": "msg_9", "delta": "x"}],
     ["response.output_item.added", "response.content_part.added",
      "response.output_text.delta"]),
    # an item done without being added: added first
    ([{"type": "response.output_item.done", "item": {"type": "function_call", "id": "fc_2",
                                                     "call_id": "c", "name": "f",
                                                     "arguments": "{}"}}],
     ["response.output_item.added", "response.function_call_arguments.done",
      "response.output_item.done"]),
    # an item never closed: closed before the response's last event
    ([{"type": "response.output_item.added", "item": {"type": "message", "id": "msg_3",
                                                      "content": []}},
      {"type": "response.output_text.delta", "item_id": "msg_3", "delta": "x"},
      {"type": "response.completed", "response": {"id": "resp_3", "output": []}}],
     ["response.output_item.added", "response.content_part.added",
      "response.output_text.delta", "response.output_text.done",
      "response.content_part.done", "response.output_item.done", "response.completed"]),
    # an event of its own (a comment-free keep-alive, a future kind): numbered, untouched
    ([{"type": "response.queued", "response": {"id": "resp_4"}}], ["response.queued"]),
    # llama.cpp's error event: numbered
    ([{"type": "error", "code": "x", "message": "m"}], ["error"]),
])
def test_what_llama_leaves_out_is_told(events, told_types) -> None:
    sent = feed_all(events)
    assert [e["type"] for e in sent] == told_types
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))


def test_an_item_never_closed_is_listed_as_streamed() -> None:
    sent = feed_all([
        {"type": "response.output_item.added", "item": {"type": "message", "id": "msg_5",
                                                        "content": []}},
        {"type": "response.output_text.delta", "item_id": "msg_5", "delta": "Hel"},
        {"type": "response.output_text.delta", "item_id": "msg_5", "delta": "lo"},
        {"type": "response.completed", "response": {"id": "r", "usage": {
            "input_tokens": 3, "output_tokens": 2, "total_tokens": 5}}}])
    whole = sent[-1]["response"]
    assert whole["id"] == "resp_r"
    assert whole["usage"]["input_tokens_details"] == {"cached_tokens": 0}
    assert whole["usage"]["output_tokens_details"] == {"reasoning_tokens": 0}
    item = next(e["item"] for e in sent if e["type"] == "response.output_item.done")
    assert item["content"][0]["text"] == "Hello" and item["status"] == "completed"
