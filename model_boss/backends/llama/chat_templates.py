"""Chat templates for llama models served through the raw completion endpoint.

``chat_template: chatml`` (or unset) leaves chat requests to the worker's own template.
``alpaca``, ``raw`` or a Jinja file render the messages into a prompt here; the request goes to
``/v1/completions`` and the answer is turned back into a chat completion. The thinking toggle
arrives as ``chat_template_kwargs.enable_thinking``, as llama.cpp's own templates take it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from ...errors import BadRequest
from ..base import UpstreamResponse

if TYPE_CHECKING:
    import jinja2

NO_THINK_MARKER = "/no_think"
ALPACA_STOP = ["### Instruction:"]
_COPIED = ("max_tokens", "temperature", "top_p", "stop", "seed", "stream", "presence_penalty",
           "frequency_penalty", "n", "logit_bias", "user")


def uses_prompt_template(chat_template: str | None) -> bool:
    return chat_template not in (None, "", "chatml", "native")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def render_alpaca(messages: list[dict[str, Any]]) -> str:
    """System text as the preamble; each user turn an instruction; assistant turns responses."""
    system = "\n".join(_text(m.get("content")) for m in messages if m.get("role") == "system")
    parts = [system.strip() + "\n\n"] if system.strip() else []
    for message in messages:
        role, text = message.get("role"), _text(message.get("content")).strip()
        if role == "user":
            parts.append(f"### Instruction:\n{text}\n\n")
        elif role == "assistant":
            parts.append(f"### Response:\n{text}\n\n")
    parts.append("### Response:\n")
    return "".join(parts)


def render_raw(messages: list[dict[str, Any]]) -> str:
    """The message texts joined by blank lines, nothing added."""
    return "\n\n".join(_text(m.get("content")) for m in messages if m.get("content"))


@lru_cache(maxsize=32)
def _jinja(path: str, mtime: float) -> jinja2.Template:  # mtime: part of the cache key
    import jinja2  # not at the top: only a model with a template file needs it

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             autoescape=False)
    return env.from_string(Path(path).read_text())


def render_prompt(chat_template: str, messages: list[dict[str, Any]],
                  thinking: bool | None, base_dir: Path | None = None) -> str:
    """Messages → prompt text. ``thinking=False`` adds the ``/no_think`` marker to the last
    user turn for the built-in templates; Jinja templates get ``enable_thinking``."""
    if thinking is False and chat_template in ("alpaca", "raw"):
        messages = _mark_no_think(messages)
    if chat_template == "alpaca":
        return render_alpaca(messages)
    if chat_template == "raw":
        return render_raw(messages)
    path = Path(chat_template).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_file():
        raise BadRequest(f"chat template file not found: {path}", code="template_missing")
    import jinja2

    try:
        return _jinja(str(path), path.stat().st_mtime).render(
            messages=messages, add_generation_prompt=True,
            enable_thinking=True if thinking is None else thinking)
    except jinja2.TemplateError as exc:
        raise BadRequest(f"chat template {path} failed: {exc}", code="template_error") from exc


def _mark_no_think(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    marked = [dict(m) for m in messages]
    for message in reversed(marked):
        if message.get("role") == "user":
            message["content"] = f"{_text(message.get('content'))} {NO_THINK_MARKER}".strip()
            break
    return marked


def completion_body(chat_body: dict[str, Any], prompt: str, chat_template: str) -> dict[str, Any]:
    body = {k: chat_body[k] for k in _COPIED if k in chat_body}
    body["model"] = chat_body.get("model")
    body["prompt"] = prompt
    if chat_template == "alpaca":
        stop = body.get("stop") or []
        body["stop"] = ([stop] if isinstance(stop, str) else list(stop)) + ALPACA_STOP
    return body


def completion_to_chat(data: dict[str, Any]) -> dict[str, Any]:
    choices = [{"index": c.get("index", i),
                "message": {"role": "assistant", "content": c.get("text", "")},
                "logprobs": None, "finish_reason": c.get("finish_reason")}
               for i, c in enumerate(data.get("choices", []))]
    return {"id": str(data.get("id", "")).replace("cmpl-", "chatcmpl-", 1),
            "object": "chat.completion", "created": data.get("created", int(time.time())),
            "model": data.get("model"), "choices": choices, "usage": data.get("usage")}


async def completion_stream_to_chat(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Re-frame a text-completion SSE stream as chat-completion chunks."""
    buffer = b""
    first = True
    async for chunk in chunks:
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            line = event.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                yield b"data: [DONE]\n\n"
                continue
            data = orjson.loads(payload)
            if "error" in data:
                yield b"data: " + payload + b"\n\n"
                continue
            choices = []
            for i, c in enumerate(data.get("choices", [])):
                delta: dict[str, Any] = {"content": c.get("text", "")}
                if first:
                    delta["role"] = "assistant"
                choices.append({"index": c.get("index", i), "delta": delta,
                                "logprobs": None, "finish_reason": c.get("finish_reason")})
            first = False
            out = {"id": str(data.get("id", "")).replace("cmpl-", "chatcmpl-", 1),
                   "object": "chat.completion.chunk", "created": data.get("created"),
                   "model": data.get("model"), "choices": choices}
            yield b"data: " + orjson.dumps(out) + b"\n\n"


def completion_request(chat_body: dict[str, Any], chat_template: str,
                       base_dir: Path | None) -> dict[str, Any]:
    """A chat request → the completion request that renders it with ``chat_template``."""
    kwargs = chat_body.get("chat_template_kwargs")
    thinking = kwargs.get("enable_thinking") if isinstance(kwargs, dict) else None
    prompt = render_prompt(chat_template, chat_body.get("messages") or [],
                           thinking if isinstance(thinking, bool) else None, base_dir)
    return completion_body(chat_body, prompt, chat_template)


def as_chat(upstream: UpstreamResponse) -> UpstreamResponse:
    """A completion answer (whole or streamed) re-framed as a chat completion."""
    if upstream.stream is not None:
        return UpstreamResponse(upstream.status, upstream.headers,
                                stream=completion_stream_to_chat(upstream.stream))
    data = orjson.loads(upstream.body or b"{}")
    return UpstreamResponse(upstream.status, upstream.headers,
                            body=orjson.dumps(completion_to_chat(data)))
