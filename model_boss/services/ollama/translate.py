"""Pure translation between Ollama's API and the OpenAI-compatible bodies the workers take:
``keep_alive`` durations, ``options``, ``format``, messages, model names, and the answers
back (whole or as NDJSON chunks), with Ollama's durations in nanoseconds."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import orjson

from ...errors import BadRequest
from .schemas import OllamaMessage, OllamaOptions

LATEST = ":latest"
MAX_KEEP_ALIVE_S = 30 * 86400  # as x_keep_alive_s
# Go's time.ParseDuration units, as Ollama reads keep_alive strings
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
          "h": 3600.0}
_DURATION = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_NUMBER = re.compile(r"[+-]?([0-9]*\.)?[0-9]+")
# sampling options → the worker's field (llama.cpp's server reads these on its OpenAI routes)
_SAMPLING = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
             "min_p": "min_p", "typical_p": "typical_p", "repeat_penalty": "repeat_penalty",
             "repeat_last_n": "repeat_last_n", "presence_penalty": "presence_penalty",
             "frequency_penalty": "frequency_penalty", "seed": "seed", "stop": "stop",
             "num_keep": "n_keep", "mirostat": "mirostat", "mirostat_tau": "mirostat_tau",
             "mirostat_eta": "mirostat_eta"}
_DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop"}
NS = 1_000_000_000


def parse_keep_alive(value: Any) -> float | None:
    """Ollama's ``keep_alive`` as model-boss's keep-alive seconds: None (the model's own
    stay-warm), 0 (unload when done), -1 (until evicted) or seconds. Numbers are seconds,
    strings Go durations ("5m", "1h30m", "300ms"; a bare number is seconds); any negative
    value means forever, as in Ollama."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if text == "":
            return None
        if _NUMBER.fullmatch(text):
            seconds = float(text)
        else:
            sign = -1.0 if text.startswith("-") else 1.0
            body = text.lstrip("+-")
            parts = _DURATION.findall(body)
            if not parts or "".join(n + u for n, u in parts) != body:
                raise BadRequest(f"keep_alive: {value!r} is not a duration (examples: \"5m\", "
                                 "\"1h30m\", \"300s\", 0, -1)", param="keep_alive")
            seconds = sign * sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        seconds = float(value)
    if seconds < 0:
        return -1.0
    if seconds > MAX_KEEP_ALIVE_S:
        raise BadRequest(f"keep_alive: at most {MAX_KEEP_ALIVE_S // 86400} days; use -1 to "
                         "keep the model until it is evicted", param="keep_alive")
    return seconds


def name_variants(name: str) -> list[str]:
    """The names to try for an Ollama model name, in order: as given, without an implicit
    ``:latest``, with it ("smollm2:latest" finds "smollm2" and "smollm2" finds
    "smollm2:latest")."""
    variants = [name]
    if name.endswith(LATEST):
        variants.append(name[: -len(LATEST)])
    elif ":" not in name.removeprefix("task:"):
        variants.append(name + LATEST)
    return variants


def resolve_name(name: str, known: Callable[[str], bool]) -> str:
    """The first variant of ``name`` that ``known`` accepts; else ``name`` (the router
    answers 404 for it)."""
    return next((n for n in name_variants(name) if known(n)), name)


def worker_params(options: OllamaOptions | None, ctx_per_request: int | None,
                  model_id: str) -> dict[str, Any]:
    """Ollama ``options`` as worker body fields. ``num_predict`` becomes ``max_tokens``
    (-1 and -2, "until done" and "fill the context", set no limit). ``num_ctx`` cannot
    change a loaded model's context (the manifest sets it): one within the context each
    request gets is accepted, a larger one is a 400 naming the manifest's value."""
    if options is None:
        return {}
    params: dict[str, Any] = {}
    for option, field in _SAMPLING.items():
        value = getattr(options, option)
        if value is not None:
            params[field] = value
    if options.num_predict is not None and options.num_predict > 0:
        params["max_tokens"] = options.num_predict
    if options.num_ctx is not None and ctx_per_request is not None \
            and options.num_ctx > ctx_per_request:
        raise BadRequest(
            f"options.num_ctx: {options.num_ctx} is larger than the {ctx_per_request} tokens "
            f"of context '{model_id}' gives each request (its manifest's ctx_size divided by "
            "its parallel slots); raise ctx_size in the manifest", param="options.num_ctx",
            code="context_too_large")
    return params


# llama.cpp's grammars/json.gbnf (MIT): a JSON object, as Ollama's format "json" asks for. A
# grammar, not an empty schema: llama.cpp applies this from the first token on.
JSON_GRAMMAR = r"""root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
"""


def format_params(fmt: Any, *, chat: bool) -> dict[str, Any]:
    """``format``: "json" is a JSON object (llama.cpp's JSON grammar); an object is a JSON
    schema the output must follow (llama.cpp compiles it into a grammar; a schema it cannot
    compile is a 400)."""
    if fmt in (None, ""):
        return {}
    if fmt == "json":
        return {"grammar": JSON_GRAMMAR}
    if not chat:
        return {"json_schema": fmt}
    return {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "format", "schema": fmt}}}


def openai_messages(messages: Iterable[OllamaMessage], *, vision: bool,
                    model_id: str) -> list[dict[str, Any]]:
    """Ollama messages as OpenAI ones: images become ``image_url`` parts (data URLs) for a
    model that can see, tool calls get their arguments as JSON text."""
    result = []
    for position, message in enumerate(messages):
        out: dict[str, Any] = {"role": message.role, "content": message.content or ""}
        if message.images:
            if not vision:
                raise no_vision(model_id, f"messages.{position}.images")
            out["content"] = [{"type": "text", "text": message.content or ""},
                              *({"type": "image_url", "image_url": {"url": data_url(image)}}
                                for image in message.images)]
        if message.tool_calls:
            out["tool_calls"] = [
                {"id": f"call_{position}_{index}", "type": "function",
                 "function": {"name": call.function.name,
                              "arguments": orjson.dumps(call.function.arguments).decode()}}
                for index, call in enumerate(message.tool_calls)]
        if message.role == "tool" and message.tool_name:
            out["name"] = message.tool_name
        result.append(out)
    return result


def no_vision(model_id: str, param: str) -> BadRequest:
    return BadRequest(f"'{model_id}' cannot read images: it has no vision projector "
                      "(a manifest's mmproj, or an mmproj*.gguf beside a discovered file)",
                      param=param, code="images_not_supported")


def data_url(image: str) -> str:
    """A base64 image (as Ollama clients send it) as a data URL; one that is a URL already
    stays as it is."""
    if image.startswith(("data:", "http://", "https://")):
        return image
    kind = "png" if image.startswith("iVBOR") else "jpeg" if image.startswith("/9j/") \
        else "webp" if image.startswith("UklGR") else "png"
    return f"data:image/{kind};base64,{image}"


def tools_param(tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"tools": tools} if tools else {}


# -- answers ------------------------------------------------------------------------------

def created_at(epoch: float | None = None) -> str:
    """An RFC 3339 time as Ollama writes it."""
    moment = datetime.fromtimestamp(time.time() if epoch is None else epoch, UTC)
    return moment.isoformat().replace("+00:00", "Z")


def done_reason(finish_reason: str | None) -> str:
    return _DONE_REASONS.get(finish_reason or "stop", finish_reason or "stop")


def final_fields(reason: str | None, usage: dict[str, Any] | None,
                 timings: dict[str, Any] | None, total_s: float,
                 waited_s: float) -> dict[str, Any]:
    """Ollama's closing fields: ``done``, ``done_reason``, token counts and durations (ns)
    from the worker's timings; ``load_duration`` is the time the request waited for its
    model (queue and load)."""
    usage, timings = usage or {}, timings or {}
    prompt_n = usage.get("prompt_tokens", timings.get("prompt_n", 0))
    eval_n = usage.get("completion_tokens", timings.get("predicted_n", 0))
    return {"done": True, "done_reason": done_reason(reason),
            "total_duration": int(total_s * NS), "load_duration": int(waited_s * NS),
            "prompt_eval_count": int(prompt_n or 0),
            "prompt_eval_duration": int(float(timings.get("prompt_ms", 0) or 0) * 1e6),
            "eval_count": int(eval_n or 0),
            "eval_duration": int(float(timings.get("predicted_ms", 0) or 0) * 1e6)}


def ollama_tool_calls(calls: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """OpenAI tool calls (arguments as JSON text) as Ollama's (arguments as an object)."""
    result = []
    for call in calls or []:
        function = call.get("function") or {}
        arguments = function.get("arguments") or "{}"
        if isinstance(arguments, str):
            try:
                arguments = orjson.loads(arguments)
            except orjson.JSONDecodeError:
                arguments = {"arguments": arguments}
        result.append({"function": {"name": function.get("name", ""), "arguments": arguments}})
    return result


def chat_message(message: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.get("role") or "assistant",
                           "content": message.get("content") or ""}
    if message.get("reasoning_content"):
        out["thinking"] = message["reasoning_content"]
    if message.get("tool_calls"):
        out["tool_calls"] = ollama_tool_calls(message["tool_calls"])
    return out
