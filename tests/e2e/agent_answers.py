"""Whether each answer the coding agents got was right by its API, whatever the model chose to
say: Anthropic's Messages API on ``/v1/messages`` (Claude Code) and OpenAI's Responses API on
``/v1/responses`` (Codex). Each check reads one recorded exchange (tests/e2e/agent_recorder.py)
and returns what is wrong with it, nothing when it is right.

What is right, for an answer whatever its content:

- a stream: the API's events in the API's order, one id of the API's form throughout, every
  block or item opened before its deltas and closed once, tool calls naming a tool the request
  offered with arguments that parse as a JSON object, the stop reason agreeing with the blocks
  (``tool_use`` exactly when a tool was called) and with the bound (``max_tokens`` exactly
  when the answer took all the request allowed, never more), and the usage counted;
- a whole answer: the same rules over its one JSON document;
- a refusal: the API's own error envelope; where the prompt outgrew the context, Anthropic's
  ``prompt is too long: N tokens > M maximum`` with N over M (Claude Code acts on that
  wording), or OpenAI's ``context_length_exceeded``. Any other refusal, and any 5xx, is wrong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from tests.e2e.agent_recorder import Exchange

MESSAGE_ID = re.compile(r"^msg_[A-Za-z0-9_-]+$")
TOOL_USE_ID = re.compile(r"^toolu_[A-Za-z0-9_-]+$")
RESPONSE_ID = re.compile(r"^resp_[A-Za-z0-9_-]+$")
TOO_LONG = re.compile(r"^prompt is too long: (\d+) tokens > (\d+) maximum")
STOP_REASONS = {"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn",
                "refusal", "model_context_window_exceeded"}
DELTA_FOR = {"text": {"text_delta"}, "tool_use": {"input_json_delta"},
             "thinking": {"thinking_delta", "signature_delta"}}


def sse(answer: bytes) -> Iterator[tuple[str | None, Any]]:
    """Each server-sent event of ``answer``: its ``event:`` name (or None) and its data,
    JSON decoded; comment lines (``: loading ...``) are skipped."""
    for block in answer.decode().replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        if data:
            text = "\n".join(data)
            yield name, text if text == "[DONE]" else json.loads(text)


def streamed(exchange: Exchange) -> bool:
    return isinstance(exchange.body, dict) and exchange.body.get("stream") is True


def tool_names(body: Any) -> set[str]:
    tools = body.get("tools") or [] if isinstance(body, dict) else []
    return {tool.get("name") for tool in tools if isinstance(tool, dict)}


def refusal_problems(exchange: Exchange, anthropic: bool, context: int) -> list[str]:
    """A 4xx in the route's envelope, and only for a prompt the context cannot hold."""
    if exchange.status >= 500:
        return [f"answered {exchange.status}"]
    try:
        error = json.loads(exchange.answer)["error"]
    except (ValueError, KeyError, TypeError):
        return [f"a {exchange.status} outside the API's error envelope"]
    if anthropic:
        if json.loads(exchange.answer).get("type") != "error" or \
                error.get("type") != "invalid_request_error":
            return [f"not Anthropic's error envelope: {error}"]
        too_long = TOO_LONG.match(error.get("message", ""))
        if exchange.status != 400 or too_long is None:
            return [f"refused other than for a prompt too long: {exchange.status} {error}"]
        tokens, maximum = int(too_long[1]), int(too_long[2])
        if maximum != context or tokens <= maximum:
            return [f"'too long' with {tokens} tokens against {maximum} (context {context})"]
        return []
    if exchange.status != 400 or error.get("code") != "context_length_exceeded":
        return [f"refused other than for a context exceeded: {exchange.status} {error}"]
    return []


# --- Anthropic's Messages API ----------------------------------------------------------------

def messages_problems(exchange: Exchange, context: int) -> list[str]:
    """What is wrong with one ``/v1/messages`` answer (an empty list: nothing)."""
    if exchange.status != 200:
        return refusal_problems(exchange, anthropic=True, context=context)
    if not streamed(exchange):
        return message_problems(json.loads(exchange.answer), exchange.body)
    problems: list[str] = []
    events = list(sse(exchange.answer))
    kinds = [data.get("type") for _, data in events]
    problems += [f"event named {name} carries {data.get('type')}" for name, data in events
                 if name is not None and name != data.get("type")]
    if not kinds or kinds[0] != "message_start" or kinds[-1] != "message_stop":
        return problems + [f"events {kinds[:3]}...{kinds[-3:]}: not message_start first and "
                           f"message_stop last"]
    if kinds.count("message_start") != 1 or kinds.count("message_delta") != 1:
        problems.append(f"{kinds.count('message_start')} message_start and "
                        f"{kinds.count('message_delta')} message_delta events")
    if "error" in kinds:
        problems.append(f"an error event mid-stream: {events[kinds.index('error')][1]}")
    message = events[0][1]["message"]
    if not MESSAGE_ID.match(str(message.get("id"))) or message.get("role") != "assistant" \
            or message.get("type") != "message":
        problems.append(f"message_start's message: {message}")
    if message.get("model") != exchange.body.get("model"):
        problems.append(f"model {message.get('model')!r}, asked {exchange.body.get('model')!r}")
    blocks: dict[int, dict[str, Any]] = {}
    open_blocks: set[int] = set()
    stop_reason, usage = None, {}
    for _, data in events[1:-1]:
        kind = data.get("type")
        if kind == "content_block_start":
            index, block = data.get("index"), dict(data.get("content_block") or {})
            if index != len(blocks) or open_blocks:
                problems.append(f"block {index} opened with {sorted(open_blocks)} open, "
                                f"after {len(blocks)} blocks")
            block["arguments"] = ""
            blocks[index] = block
            open_blocks.add(index)
        elif kind == "content_block_delta":
            index, delta = data.get("index"), data.get("delta") or {}
            if index not in open_blocks:
                problems.append(f"a delta for block {index}, which is not open")
                continue
            if delta.get("type") not in DELTA_FOR.get(blocks[index].get("type"), set()):
                problems.append(f"a {delta.get('type')} in a {blocks[index].get('type')} "
                                f"block")
            blocks[index]["arguments"] += delta.get("partial_json", "")
        elif kind == "content_block_stop":
            if data.get("index") not in open_blocks:
                problems.append(f"block {data.get('index')} closed but not open")
            open_blocks.discard(data.get("index"))
        elif kind == "message_delta":
            stop_reason = (data.get("delta") or {}).get("stop_reason")
            usage = data.get("usage") or {}
        elif kind != "ping":
            problems.append(f"an unexpected {kind} event")
    if open_blocks:
        problems.append(f"blocks {sorted(open_blocks)} never closed")
    for block in blocks.values():
        if block.get("type") == "tool_use":
            block["input"] = parsed_object(block.pop("arguments") or "{}", problems)
    problems += content_problems(list(blocks.values()), stop_reason, exchange.body)
    if not isinstance(usage.get("output_tokens"), int) or \
            (blocks and usage["output_tokens"] <= 0):
        problems.append(f"message_delta's usage: {usage}")
    else:
        problems += bound_problems(usage["output_tokens"], stop_reason, exchange.body)
    return problems


def bound_problems(output_tokens: int, stop_reason: Any, body: Any) -> list[str]:
    """An answer within the request's ``max_tokens``, and cut there exactly when it says
    ``max_tokens``."""
    bound = body.get("max_tokens") if isinstance(body, dict) else None
    if not isinstance(bound, int):
        return []
    if output_tokens > bound:
        return [f"{output_tokens} tokens answered, {bound} allowed"]
    if (stop_reason == "max_tokens") != (output_tokens == bound):
        return [f"stop reason {stop_reason!r} after {output_tokens} of {bound} tokens"]
    return []


def message_problems(message: dict[str, Any], body: Any) -> list[str]:
    """A whole (not streamed) Messages answer."""
    problems = []
    if not MESSAGE_ID.match(str(message.get("id"))) or message.get("type") != "message" \
            or message.get("role") != "assistant":
        problems.append(f"not a message: {str(message)[:300]}")
    usage = message.get("usage") or {}
    if not all(isinstance(usage.get(field), int) for field in ("input_tokens",
                                                                 "output_tokens")):
        problems.append(f"usage: {usage}")
    if isinstance(usage.get("output_tokens"), int):
        problems += bound_problems(usage["output_tokens"], message.get("stop_reason"), body)
    return problems + content_problems(message.get("content") or [],
                                       message.get("stop_reason"), body)


def content_problems(blocks: list[dict[str, Any]], stop_reason: Any, body: Any) -> list[str]:
    problems = []
    if stop_reason not in STOP_REASONS:
        problems.append(f"stop reason {stop_reason!r}")
    calls = [block for block in blocks if block.get("type") == "tool_use"]
    for call in calls:
        if not TOOL_USE_ID.match(str(call.get("id"))):
            problems.append(f"tool_use id {call.get('id')!r}")
        if call.get("name") not in tool_names(body):
            problems.append(f"a call to {call.get('name')!r}, not among the tools offered")
        if not isinstance(call.get("input"), dict):
            problems.append(f"tool input {call.get('input')!r}: not an object")
    if (stop_reason == "tool_use") != bool(calls) and stop_reason != "max_tokens":
        problems.append(f"stop reason {stop_reason!r} with {len(calls)} tool calls")
    return problems


def parsed_object(text: str, problems: list[str]) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        problems.append(f"tool arguments that are not JSON: {text[:200]!r}")
        return None


def message_text(exchange: Exchange) -> str:
    """The text an answer carried (its text blocks, joined), streamed or whole."""
    if not streamed(exchange):
        content = json.loads(exchange.answer).get("content") or []
        return "".join(block.get("text", "") for block in content)
    return "".join((data.get("delta") or {}).get("text", "") for _, data in
                   sse(exchange.answer) if data.get("type") == "content_block_delta")


def output_tokens(exchange: Exchange) -> int | None:
    """The tokens an answer counted as its output, streamed or whole."""
    if not streamed(exchange):
        return (json.loads(exchange.answer).get("usage") or {}).get("output_tokens")
    counted = [(data.get("usage") or {}).get("output_tokens") for _, data in
               sse(exchange.answer) if data.get("type") == "message_delta"]
    return counted[-1] if counted else None


def stop_reason(exchange: Exchange) -> str | None:
    if not streamed(exchange):
        return json.loads(exchange.answer).get("stop_reason")
    reasons = [(data.get("delta") or {}).get("stop_reason") for _, data in
               sse(exchange.answer) if data.get("type") == "message_delta"]
    return reasons[-1] if reasons else None


# --- OpenAI's Responses API ------------------------------------------------------------------

def responses_problems(exchange: Exchange, context: int) -> list[str]:
    """What is wrong with one ``/v1/responses`` answer (an empty list: nothing)."""
    if exchange.status != 200:
        return refusal_problems(exchange, anthropic=False, context=context)
    if not streamed(exchange):
        return response_problems(json.loads(exchange.answer), exchange.body)
    problems: list[str] = []
    events = [data for _, data in sse(exchange.answer) if data != "[DONE]"]
    kinds = [event.get("type") for event in events]
    if not kinds or kinds[0] != "response.created" or kinds[-1] != "response.completed":
        return [f"events {kinds[:3]}...{kinds[-3:]}: not response.created first and "
                f"response.completed last"]
    numbers = [event.get("sequence_number") for event in events]
    if numbers != sorted(numbers) or len(set(numbers)) != len(numbers):
        problems.append(f"sequence numbers out of order: {numbers[:10]}...")
    ids = {event["response"].get("id") for event in events if "response" in event}
    if len(ids) != 1 or not RESPONSE_ID.match(str(next(iter(ids)))):
        problems.append(f"response ids {ids}")
    added: dict[int, dict[str, Any]] = {}
    done: set[int] = set()
    for event in events[1:-1]:
        kind = event.get("type", "")
        index = event.get("output_index")
        if kind == "response.output_item.added":
            if index != len(added):
                problems.append(f"item {index} added after {len(added)} items")
            added[index] = event.get("item") or {}
        elif kind == "response.output_item.done":
            if index not in added or index in done:
                problems.append(f"item {index} done, not open")
            done.add(index)
        elif kind.startswith(("response.output_text.", "response.content_part.",
                              "response.function_call_arguments.",
                              "response.reasoning")):
            if index not in added or index in done:
                problems.append(f"a {kind} for item {index}, which is not open")
            elif event.get("item_id", added[index].get("id")) != added[index].get("id"):
                problems.append(f"a {kind} for item {event.get('item_id')}, the open one is "
                                f"{added[index].get('id')}")
        elif kind not in ("response.in_progress",):
            problems.append(f"an unexpected {kind} event")
    if set(added) != done:
        problems.append(f"items {sorted(set(added) - done)} never done")
    final = events[-1]["response"]
    return problems + response_problems(final, exchange.body)


def response_problems(response: dict[str, Any], body: Any) -> list[str]:
    """A whole Responses answer (or a stream's final one)."""
    problems = []
    if not RESPONSE_ID.match(str(response.get("id"))) or response.get("status") != "completed":
        problems.append(f"response {response.get('id')!r} status {response.get('status')!r}")
    usage = response.get("usage") or {}
    counted = [usage.get(field) for field in ("input_tokens", "output_tokens", "total_tokens")]
    if not all(isinstance(value, int) for value in counted) or \
            counted[0] + counted[1] != counted[2] or counted[0] <= 0:
        problems.append(f"usage: {usage}")
    for item in response.get("output") or []:
        if item.get("type") == "function_call":
            if item.get("name") not in tool_names(body) or not item.get("call_id"):
                problems.append(f"a call to {item.get('name')!r} ({item.get('call_id')!r}), "
                                f"not among the tools offered")
            if not isinstance(parsed_object(item.get("arguments") or "", problems), dict):
                problems.append(f"arguments {item.get('arguments')!r}: not an object")
    return problems
