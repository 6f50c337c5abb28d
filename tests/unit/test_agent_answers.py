"""The rules tests/e2e/test_agents.py holds the coding agents' answers to
(tests/e2e/agent_answers.py), as a table: answers right by their API pass whatever the model
said, and each way of being wrong is named."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.agent_answers import (
    message_text,
    messages_problems,
    output_tokens,
    responses_problems,
    stop_reason,
)
from tests.e2e.agent_recorder import Exchange

CONTEXT = 8192
TOOLS = [{"name": "Bash", "input_schema": {"type": "object"}}]
ASKED = {"model": "smol", "stream": True, "max_tokens": 64, "tools": TOOLS,
         "messages": [{"role": "user", "content": "say hi"}]}


def sse(*events: dict[str, Any], named: bool = True) -> bytes:
    return b"".join((f"event: {event['type']}\n" if named else "").encode()
                    + f"data: {json.dumps(event)}\n\n".encode() for event in events)


def start(message_id: str = "msg_01abc", model: str = "smol") -> dict[str, Any]:
    return {"type": "message_start", "message": {
        "id": message_id, "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "usage": {"input_tokens": 12, "output_tokens": 0}}}


def text_block(index: int = 0, *pieces: str) -> list[dict[str, Any]]:
    return [{"type": "content_block_start", "index": index,
             "content_block": {"type": "text", "text": ""}},
            *({"type": "content_block_delta", "index": index,
               "delta": {"type": "text_delta", "text": piece}} for piece in pieces),
            {"type": "content_block_stop", "index": index}]


def tool_block(index: int, name: str = "Bash", *parts: str,
               tool_id: str = "toolu_01xyz") -> list[dict[str, Any]]:
    return [{"type": "content_block_start", "index": index,
             "content_block": {"type": "tool_use", "id": tool_id, "name": name, "input": {}}},
            *({"type": "content_block_delta", "index": index,
               "delta": {"type": "input_json_delta", "partial_json": part}} for part in parts),
            {"type": "content_block_stop", "index": index}]


def end(reason: str = "end_turn", output: int = 3) -> list[dict[str, Any]]:
    return [{"type": "message_delta", "delta": {"stop_reason": reason},
             "usage": {"output_tokens": output}}, {"type": "message_stop"}]


def streamed(*events: dict[str, Any], status: int = 200, named: bool = True) -> Exchange:
    return Exchange("POST", "/v1/messages", ASKED, status, sse(*events, named=named))


ANSWER = [start(), {"type": "ping"}, *text_block(0, "Hel", "lo!"), *end()]
TOOL_CALL = [start(), *text_block(0, "Let me look."),
             *tool_block(1, "Bash", '{"command": ', '"ls"}'), *end("tool_use")]


@pytest.mark.parametrize("events", [ANSWER, TOOL_CALL, [start(), *end("max_tokens", 64)],
                                    [start(), *text_block(0, "hi"), *end("max_tokens", 64)]],
                         ids=["an answer", "a tool call", "nothing but thinking to the bound",
                              "an answer cut at the bound"])
def test_a_right_stream_passes_whatever_was_said(events: list[dict[str, Any]]) -> None:
    assert messages_problems(streamed(*events), CONTEXT) == []


WRONG_STREAMS = {
    "no message_stop": ([start(), *text_block(0, "hi"), end()[0]], "message_stop last"),
    "a second message_start": ([start(), start(), *text_block(0, "hi"), *end()],
                               "2 message_start"),
    "an id of another API": ([start("chatcmpl-1"), *text_block(0, "hi"), *end()],
                             "message_start's message"),
    "another model named": ([start(model="other"), *text_block(0, "hi"), *end()],
                            "model 'other'"),
    "a delta in a closed block": ([start(), *text_block(0, "hi"),
                                   {"type": "content_block_delta", "index": 0,
                                    "delta": {"type": "text_delta", "text": "x"}}, *end()],
                                  "which is not open"),
    "a block left open": ([start(), *text_block(0, "hi")[:-1], *end()], "never closed"),
    "a text delta in a tool block": ([start(), tool_block(0)[0],
                                      {"type": "content_block_delta", "index": 0,
                                       "delta": {"type": "text_delta", "text": "x"}},
                                      tool_block(0)[-1], *end("tool_use")],
                                     "a text_delta in a tool_use block"),
    "a tool not offered": ([start(), *tool_block(0, "Rm", "{}"), *end("tool_use")],
                           "not among the tools offered"),
    "arguments that are not JSON": ([start(), *tool_block(0, "Bash", '{"command": '),
                                     *end("tool_use")], "not JSON"),
    "a tool id of another API": ([start(), *tool_block(0, "Bash", "{}", tool_id="call_1"),
                                  *end("tool_use")], "tool_use id"),
    "tool_use without a call": ([start(), *text_block(0, "hi"), *end("tool_use")],
                                "with 0 tool calls"),
    "a call stopped as end_turn": ([start(), *tool_block(0, "Bash", "{}"), *end()],
                                   "'end_turn' with 1 tool calls"),
    "OpenAI's stop reason": ([start(), *text_block(0, "hi"), *end("stop")],
                             "stop reason 'stop'"),
    "no output counted": ([start(), *text_block(0, "hi"), *end(output=0)],
                          "message_delta's usage"),
    "more than allowed": ([start(), *text_block(0, "hi"), *end("max_tokens", 65)],
                          "65 tokens answered, 64 allowed"),
    "cut short of the bound": ([start(), *text_block(0, "hi"), *end("max_tokens", 9)],
                               "'max_tokens' after 9 of 64"),
    "all the bound, said ended": ([start(), *text_block(0, "hi"), *end("end_turn", 64)],
                                  "'end_turn' after 64 of 64"),
    "an error mid-stream": ([start(), *text_block(0, "hi"),
                             {"type": "error", "error": {"type": "api_error"}}, *end()],
                            "an error event mid-stream"),
}


@pytest.mark.parametrize("events, said", WRONG_STREAMS.values(), ids=WRONG_STREAMS.keys())
def test_a_wrong_stream_is_named(events: list[dict[str, Any]], said: str) -> None:
    problems = messages_problems(streamed(*events), CONTEXT)
    assert any(said in problem for problem in problems), problems


def test_an_event_name_must_say_its_data() -> None:
    raw = sse(*ANSWER).replace(b"event: ping", b"event: message_stop", 1)
    problems = messages_problems(Exchange("POST", "/v1/messages", ASKED, 200, raw), CONTEXT)
    assert problems == ["event named message_stop carries ping"]


def error(kind: str, message: str, anthropic: bool = True) -> bytes:
    body = {"error": {"type": kind, "message": message}}
    return json.dumps({"type": "error", **body} if anthropic else body).encode()


REFUSALS = {
    "too long, in Anthropic's words": (400, error(
        "invalid_request_error", "prompt is too long: 8257 tokens > 8192 maximum (...)"), []),
    "too long, but fewer tokens than the context": (400, error(
        "invalid_request_error", "prompt is too long: 8000 tokens > 8192 maximum"),
        ["'too long' with 8000 tokens"]),
    "too long against another context": (400, error(
        "invalid_request_error", "prompt is too long: 9000 tokens > 4096 maximum"),
        ["'too long' with 9000 tokens against 4096"]),
    "too long, in OpenAI's envelope": (400, error(
        "invalid_request_error", "prompt is too long: 8257 tokens > 8192 maximum",
        anthropic=False), ["not Anthropic's error envelope"]),
    "any other refusal": (400, error("invalid_request_error", "messages: required"),
                          ["refused other than for a prompt too long"]),
    "a server error": (500, error("api_error", "boom"), ["answered 500"]),
    "a page for an error": (404, b"<html>not found</html>", ["outside the API's error"]),
}


@pytest.mark.parametrize("status, answer, wanted", REFUSALS.values(), ids=REFUSALS.keys())
def test_only_a_prompt_too_long_may_be_refused(status: int, answer: bytes,
                                               wanted: list[str]) -> None:
    problems = messages_problems(Exchange("POST", "/v1/messages", ASKED, status, answer),
                                 CONTEXT)
    assert [p for p in problems if not any(w in p for w in wanted)] == [] and \
        len(problems) == len(wanted), problems


def test_a_whole_answer_follows_the_same_rules() -> None:
    asked = {**ASKED, "stream": False}
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "smol",
               "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash",
                            "input": {"command": "ls"}}],
               "stop_reason": "tool_use", "usage": {"input_tokens": 5, "output_tokens": 9}}
    right = Exchange("POST", "/v1/messages", asked, 200, json.dumps(message).encode())
    assert messages_problems(right, CONTEXT) == []
    assert stop_reason(right) == "tool_use" and message_text(right) == ""
    assert output_tokens(right) == 9
    wrong = {**message, "stop_reason": "end_turn", "usage": {"input_tokens": 5}}
    problems = messages_problems(
        Exchange("POST", "/v1/messages", asked, 200, json.dumps(wrong).encode()), CONTEXT)
    assert len(problems) == 2 and "usage" in problems[0] and "'end_turn'" in problems[1]


def test_the_text_and_stop_reason_of_a_stream() -> None:
    exchange = streamed(*ANSWER, named=False)
    assert message_text(exchange) == "Hello!" and stop_reason(exchange) == "end_turn"
    assert output_tokens(exchange) == 3
    assert messages_problems(exchange, CONTEXT) == []


# --- the Responses API -----------------------------------------------------------------------

RESPONSE_TOOLS = [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]
RESPONSE_ASKED = {"model": "smol", "stream": True, "tools": RESPONSE_TOOLS, "input": []}


def response(status: str = "in_progress", output: list | None = None,
             usage: dict | None = None, response_id: str = "resp_1") -> dict[str, Any]:
    return {"id": response_id, "object": "response", "status": status, "output": output or [],
            "usage": usage}


MESSAGE_ITEM = {"id": "msg_1", "type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": "hi"}]}
CALL_ITEM = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "shell",
             "arguments": '{"command": ["ls"]}'}
USAGE = {"input_tokens": 40, "output_tokens": 2, "total_tokens": 42}


def response_stream(*middle: dict[str, Any], final: dict[str, Any] | None = None,
                    first_id: str = "resp_1") -> list[dict[str, Any]]:
    events = [{"type": "response.created", "response": response(response_id=first_id)},
              {"type": "response.in_progress", "response": response()}, *middle,
              {"type": "response.completed",
               "response": final or response("completed", [MESSAGE_ITEM], USAGE)}]
    return [{**event, "sequence_number": number} for number, event in enumerate(events)]


TEXT_ITEM = [{"type": "response.output_item.added", "output_index": 0,
              "item": {**MESSAGE_ITEM, "content": []}},
             {"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_1",
              "delta": "hi"},
             {"type": "response.output_item.done", "output_index": 0, "item": MESSAGE_ITEM}]


def responses_exchange(events: list[dict[str, Any]], status: int = 200,
                       answer: bytes | None = None) -> Exchange:
    raw = answer if answer is not None else sse(*events) + b"data: [DONE]\n\n"
    return Exchange("POST", "/v1/responses", RESPONSE_ASKED, status, raw)


def test_a_right_responses_stream_passes() -> None:
    assert responses_problems(responses_exchange(response_stream(*TEXT_ITEM)), CONTEXT) == []
    call = [{"type": "response.output_item.added", "output_index": 0, "item": CALL_ITEM},
            {"type": "response.function_call_arguments.delta", "output_index": 0,
             "item_id": "fc_1", "delta": CALL_ITEM["arguments"]},
            {"type": "response.output_item.done", "output_index": 0, "item": CALL_ITEM}]
    final = response("completed", [CALL_ITEM], USAGE)
    assert responses_problems(responses_exchange(response_stream(*call, final=final)),
                              CONTEXT) == []


WRONG_RESPONSES = {
    "no completed event": (response_stream(*TEXT_ITEM)[:-1], "not response.created first"),
    "two ids": (response_stream(*TEXT_ITEM, first_id="resp_2"), "response ids"),
    "a delta for an item not open": (response_stream(TEXT_ITEM[1]), "which is not open"),
    "an item never done": (response_stream(*TEXT_ITEM[:2]), "never done"),
    "a delta for another item": (response_stream(TEXT_ITEM[0], {**TEXT_ITEM[1],
                                                                "item_id": "msg_9"},
                                                 TEXT_ITEM[2]), "the open one is msg_1"),
    "usage that does not add up": (response_stream(*TEXT_ITEM, final=response(
        "completed", [MESSAGE_ITEM], {**USAGE, "total_tokens": 7})), "usage"),
    "a call to a tool not offered": (response_stream(*TEXT_ITEM, final=response(
        "completed", [{**CALL_ITEM, "name": "rm"}], USAGE)), "not among the tools"),
    "arguments not JSON": (response_stream(*TEXT_ITEM, final=response(
        "completed", [{**CALL_ITEM, "arguments": "{"}], USAGE)), "not JSON"),
    "an incomplete response": (response_stream(*TEXT_ITEM, final=response(
        "incomplete", [MESSAGE_ITEM], USAGE)), "status 'incomplete'"),
}


@pytest.mark.parametrize("events, said", WRONG_RESPONSES.values(),
                         ids=WRONG_RESPONSES.keys())
def test_a_wrong_responses_stream_is_named(events: list[dict[str, Any]], said: str) -> None:
    problems = responses_problems(responses_exchange(events), CONTEXT)
    assert any(said in problem for problem in problems), problems


def test_sequence_numbers_go_up() -> None:
    events = response_stream(*TEXT_ITEM)
    events[2]["sequence_number"], events[3]["sequence_number"] = 3, 2
    problems = responses_problems(responses_exchange(events), CONTEXT)
    assert problems and problems[0].startswith("sequence numbers out of order")


@pytest.mark.parametrize("code, wanted", [("context_length_exceeded", 0),
                                          ("invalid_value", 1)])
def test_a_responses_refusal_only_for_a_context_exceeded(code: str, wanted: int) -> None:
    body = json.dumps({"error": {"type": "invalid_request_error", "code": code,
                                 "message": "..."}}).encode()
    problems = responses_problems(responses_exchange([], 400, body), CONTEXT)
    assert len(problems) == wanted, problems
