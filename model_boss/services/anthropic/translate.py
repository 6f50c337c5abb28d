"""Anthropic's Messages API in chat-completions terms and back, for the workers that speak
only OpenAI's API (OpenAI-compatible remotes, command workers, llama.cpp with a template
rendered here). Streams are in :mod:`.stream`."""

from __future__ import annotations

import uuid
from typing import Any

import orjson

# OpenAI's finish_reason → Anthropic's stop_reason
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                "function_call": "tool_use", "content_filter": "refusal"}
_SAMPLING = ("temperature", "top_p", "top_k", "stream")
# Anthropic's own fields with no chat-completions counterpart: not sent on
_ANTHROPIC_ONLY = {"messages", "system", "max_tokens", "stop_sequences", "tools", "tool_choice",
                   "thinking", "metadata", "service_tier", "container", "mcp_servers",
                   "context_management", "output_config", "output_format", "cache_control",
                   "inference_geo", "speed", "diagnostics", "user_profile_id", "workspace_id",
                   *_SAMPLING}


def message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A validated Messages body (``model`` already set) as a chat-completions body."""
    chat: dict[str, Any] = {k: v for k, v in body.items() if k not in _ANTHROPIC_ONLY}
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        text = system if isinstance(system, str) else "\n\n".join(b["text"] for b in system)
        messages.append({"role": "system", "content": text})
    for message in body["messages"]:
        messages.extend(_chat_messages(message))
    chat["messages"] = messages
    if "max_tokens" in body:
        chat["max_tokens"] = body["max_tokens"]
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    for name in _SAMPLING:
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stream"):
        chat["stream_options"] = {"include_usage": True}
    tools = [t for t in body.get("tools") or [] if t.get("type") in (None, "custom")]
    if tools:
        chat["tools"] = [{"type": "function", "function": {
            "name": t["name"], "description": t.get("description") or "",
            "parameters": t["input_schema"]}} for t in tools]
    choice = body.get("tool_choice")
    if choice:
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(
            choice["type"]) or {"type": "function", "function": {"name": choice.get("name")}}
        if choice.get("disable_parallel_tool_use") and tools:
            chat["parallel_tool_calls"] = False
    thinking = body.get("thinking")
    if thinking:
        kwargs = dict(chat.get("chat_template_kwargs") or {})
        kwargs.setdefault("enable_thinking", thinking["type"] != "disabled")
        chat["chat_template_kwargs"] = kwargs
    return chat


def _chat_messages(message: dict[str, Any]) -> list[dict[str, Any]]:
    """One Anthropic turn as chat messages: tool results become ``tool`` messages (ahead of
    the rest of the user's turn), tool uses the assistant's ``tool_calls``."""
    role, content = message["role"], message["content"]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if role == "system":  # a system turn mid-conversation: text only
        return [{"role": "system", "content": "\n\n".join(b.get("text", "") for b in content)}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in content:
        kind = block["type"]
        if kind == "text":
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
        elif kind == "tool_use":
            calls.append({"id": block["id"], "type": "function", "function": {
                "name": block["name"], "arguments": orjson.dumps(block["input"]).decode()}})
        elif kind == "tool_result":
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                        "content": _result_text(block)})
        elif kind == "thinking":
            reasoning.append(block["thinking"])
    if role == "assistant":
        turn: dict[str, Any] = {"role": "assistant",
                                "content": "".join(p.get("text", "") for p in parts) or None}
        if calls:
            turn["tool_calls"] = calls
        if reasoning:
            turn["reasoning_content"] = "".join(reasoning)
        return [*out, turn]
    if parts:
        only_text = all(p["type"] == "text" for p in parts)
        out.append({"role": "user", "content": "".join(p["text"] for p in parts)
                    if only_text else parts})
    return out


def _image_url(source: dict[str, Any]) -> str:
    if source["type"] == "url":
        return source["url"]
    return f"data:{source['media_type']};base64,{source['data']}"


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        text = "".join(part.get("text", "") for part in content if part["type"] == "text")
    return f"Error: {text}" if block.get("is_error") else text


# the fields in which OpenAI-compatible servers name the stop string that ended a choice:
# vLLM's ``stop_reason``, SGLang's ``matched_stop``, llama.cpp's ``stopping_word``
_NAMED_STOP = ("stop_reason", "matched_stop", "stopping_word")


def matched_stop(choice: dict[str, Any], text: str, stops: list[str] | None) -> str | None:
    """The request's stop sequence that ended a choice, or None. A chat answer's
    ``finish_reason`` is ``"stop"`` whether the model ended its turn or a stop string cut it,
    and most servers leave the stop string out of the text, so: the stop sequence the server
    names (:data:`_NAMED_STOP`), else the one the text ends with (a server that keeps it);
    else None: the answer is taken as the model's own end (``end_turn``)."""
    if not stops or choice.get("finish_reason") not in ("stop", None):
        return None
    for name in _NAMED_STOP:
        named = choice.get(name)
        if isinstance(named, str) and named in stops:
            return named
    return next((stop for stop in sorted(stops, key=len, reverse=True)
                 if stop and text.endswith(stop)), None)


def from_chat(raw: bytes, model_id: str, stops: list[str] | None = None) -> bytes:
    """A chat completion as an Anthropic message; ``stops``: the request's
    ``stop_sequences`` (:func:`matched_stop`; the matched one is not part of the text)."""
    data = orjson.loads(raw)
    choice = (data.get("choices") or [{}])[0]
    said = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if said.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": said["reasoning_content"],
                        "signature": ""})
    text = said.get("content") if isinstance(said.get("content"), str) else ""
    stop = None if said.get("tool_calls") else matched_stop(choice, text, stops)
    if stop is not None and text.endswith(stop):
        text = text[:-len(stop)]
    if text:
        content.append({"type": "text", "text": text})
    for call in said.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id") or tool_use_id(),
                        "name": function.get("name", ""),
                        "input": tool_input(function.get("arguments"))})
    return orjson.dumps({
        "id": message_id(), "type": "message", "role": "assistant", "model": model_id,
        "content": content,
        "stop_reason": "stop_sequence" if stop is not None
        else stop_reason(choice.get("finish_reason"), content),
        "stop_sequence": stop, "usage": message_usage(data.get("usage") or {}, data)})


def message_usage(usage: dict[str, Any], chunk: dict[str, Any]) -> dict[str, int]:
    """A chat usage in Anthropic's terms: input tokens apart from those read from a prompt
    cache (OpenAI's ``prompt_tokens_details.cached_tokens``, llama.cpp's ``timings.cache_n``),
    which are ``cache_read_input_tokens``."""
    prompt = int(usage.get("prompt_tokens") or 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None:
        cached = (chunk.get("timings") or {}).get("cache_n")
    told = {"input_tokens": prompt, "output_tokens": int(usage.get("completion_tokens") or 0)}
    if isinstance(cached, int) and 0 < cached <= prompt:
        told["input_tokens"] = prompt - cached
        told["cache_read_input_tokens"] = cached
    return told


def stop_reason(finish: str | None, content: list[dict[str, Any]] | None = None) -> str:
    if content and any(block["type"] == "tool_use" for block in content):
        return "tool_use"
    return STOP_REASONS.get(finish or "stop", "end_turn")


def tool_use_id() -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


def tool_input(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments (a JSON string) as the ``input`` object."""
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {"arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"value": parsed}


def count_answer(raw: bytes) -> bytes:
    """A one-token chat completion's usage as count_tokens' answer."""
    usage = orjson.loads(raw).get("usage") or {}
    return orjson.dumps({"input_tokens": int(usage.get("prompt_tokens", 0))})
