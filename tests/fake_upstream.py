"""A minimal, fast OpenAI-compatible server: the stand-in for a cloud remote, as a real process.

    python -m tests.fake_upstream --port N [--require-key KEY] [--fail-status 500]
        [--chunk-delay-ms 0] [--chunks 5] [--break-after N] [--answer-delay-ms 0]
        [--arrivals-log FILE] [--count-words] [--hold-marker WORD --hold-ms 10000
        --held-log FILE]

``POST /v1/chat/completions`` answers with the last user message and the model name it
received (``echo: <text>``, ``model: <name>``); a stream sends ``--chunks`` chunks, each
after ``--chunk-delay-ms``, then a usage chunk when ``stream_options.include_usage`` asks,
then ``[DONE]``. A body with ``tools`` is answered with a call of the first tool, arguments
``{"city": "Paris"}`` (streamed in two pieces). ``POST /v1/messages`` is Anthropic's Messages
API, the same echo as a message (or its events), and wants the ``anthropic-version`` header;
``/v1/messages/count_tokens`` answers 7. ``--break-after N`` drops the connection after N
chunks (a remote that dies mid-stream); ``--arrivals-log`` appends the ``time.perf_counter()``
at which each chat request arrived (one clock for every process on the box). ``GET
/v1/models`` lists one model. A wrong or missing key (with ``--require-key``: ``Authorization:
Bearer`` or ``x-api-key``) gets 401 in the OpenAI envelope.

``POST /v1/completions`` echoes the prompt the same way (whole, or ``--chunks`` chunks and a
usage chunk when asked), and ``POST /v1/embeddings`` answers a 3-number vector per input.
Every ``usage`` says 1 prompt token, unless ``--count-words``: then the words of the last user
message, the prompt or the inputs (at least 1), so that each answer's figures differ (the
usage ledger's tests match them token for token); completion tokens are 2 for a whole answer
and ``--chunks`` for a stream. A request whose prompt holds ``--hold-marker`` is held
``--hold-ms`` before its answer, and its arrival appended to ``--held-log``: a test that kills
this process once the log says so knows that request was in it.

It is also the baseline of ``benchmarks/proxy_overhead.py``, so it is a raw ASGI app with
orjson on uvicorn's fastest loop and parser, without an access log.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any, TextIO

import orjson

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MODELS = b'{"object":"list","data":[{"id":"remote-x","object":"model","owned_by":"fake"}]}'


class UpstreamBroke(Exception):
    """Raised mid-stream on purpose: uvicorn then drops the connection without a last chunk."""


def envelope(message: str, kind: str, code: str) -> bytes:
    """An OpenAI-shaped error body."""
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None,
                                   "code": code}})


async def read_body(receive: Receive) -> bytes:
    """The whole request body (one message in the common case, so no join)."""
    message = await receive()
    body: bytes = message.get("body", b"")
    while message.get("more_body"):
        message = await receive()
        body += message.get("body", b"")
    return body


async def respond(send: Send, status: int, payload: bytes,
                  content_type: bytes = b"application/json") -> None:
    """A whole, non-streamed answer with a content-length."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


async def lifespan(receive: Receive, send: Send) -> None:
    """Acknowledge startup and shutdown; there is nothing to set up."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def last_user_text(body: dict[str, Any]) -> str:
    """The content of the last user message (its text parts), or '' when there is none."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content", "")
            if isinstance(content, list):
                return "".join(str(part.get("text", "")) for part in content
                               if isinstance(part, dict))
            return str(content)
    return ""


TOOL_ARGUMENTS = ('{"city": ', '"Paris"}')


def prompt_text(body: dict[str, Any]) -> str:
    """What a request asks about: the last user message, a completion's prompt or the
    inputs to embed (lists joined)."""
    for field in ("prompt", "input"):
        value = body.get(field)
        if value is not None:
            return " ".join(map(str, value)) if isinstance(value, list) else str(value)
    return last_user_text(body)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def embeddings_answer(body: dict[str, Any], model: Any, prompt_tokens: int) -> bytes:
    inputs = body.get("input")
    count = len(inputs) if isinstance(inputs, list) else 1
    return orjson.dumps({
        "object": "list", "model": model,
        "data": [{"object": "embedding", "index": i, "embedding": [0.1, 0.2, 0.3]}
                 for i in range(count)],
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}})


def tool_call_answer(body: dict[str, Any], model: Any) -> bytes:
    name = body["tools"][0]["function"]["name"]
    return orjson.dumps({
        "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None, "tool_calls": [{
                "id": "call_fake", "type": "function",
                "function": {"name": name, "arguments": "".join(TOOL_ARGUMENTS)}}]}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}})


def sse(data: dict[str, Any], kind: str | None = None) -> bytes:
    head = f"event: {kind}\n".encode() if kind else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


async def messages_answer(send: Send, body: dict[str, Any], chunks: int) -> None:
    """Anthropic's Messages API: the echo as a message, or as its stream of events."""
    text = f"echo: {last_user_text(body)}"
    message = {"id": "msg_fake", "type": "message", "role": "assistant",
               "model": body.get("model"), "content": [{"type": "text", "text": text}],
               "stop_reason": "end_turn", "stop_sequence": None,
               "usage": {"input_tokens": 7, "output_tokens": chunks}}
    if not body.get("stream"):
        await respond(send, 200, orjson.dumps(message))
        return
    events = [sse({"type": "message_start",
                   "message": {**message, "content": [], "stop_reason": None}}, "message_start"),
              sse({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "text", "text": ""}}, "content_block_start")]
    events += [sse({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": f"part{i} "}},
                   "content_block_delta") for i in range(chunks)]
    events += [sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
               sse({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                    "usage": {"output_tokens": chunks}}, "message_delta"),
               sse({"type": "message_stop"}, "message_stop")]
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    for one in events:
        await send({"type": "http.response.body", "body": one, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def make_app(require_key: str | None = None, fail_status: int | None = None,
             chunk_delay_ms: float = 0.0, chunks: int = 5,
             break_after: int | None = None, answer_delay_ms: float = 0.0,
             arrivals: TextIO | None = None, count_words: bool = False,
             hold_marker: str | None = None, hold_ms: float = 10_000.0,
             held: TextIO | None = None) -> ASGIApp:
    """The ASGI app, configured by the command-line flags."""
    expected = f"Bearer {require_key}".encode() if require_key else None
    anthropic_key = require_key.encode() if require_key else None
    delay_s = chunk_delay_ms / 1000

    def prompt_tokens(body: dict[str, Any]) -> int:
        return max(1, len(prompt_text(body).split())) if count_words else 1

    async def stream(send: Send, model: Any, body: dict[str, Any],
                     completion: bool = False) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"),
                                (b"cache-control", b"no-cache")]})
        kind = "text_completion" if completion else "chat.completion.chunk"
        base = {"id": "chatcmpl-fake", "object": kind, "created": int(time.time()),
                "model": model}
        if body.get("tools"):
            name = body["tools"][0]["function"]["name"]
            for i, piece in enumerate(TOOL_ARGUMENTS):
                call = {"index": 0, "function": {"arguments": piece}}
                if i == 0:
                    call.update(id="call_fake", type="function")
                    call["function"]["name"] = name
                await send({"type": "http.response.body", "more_body": True, "body": sse(
                    {**base, "choices": [{"index": 0, "delta": {"tool_calls": [call]},
                                          "finish_reason": None}]})})
            await send({"type": "http.response.body", "more_body": True, "body": sse(
                {**base, "choices": [{"index": 0, "delta": {},
                                      "finish_reason": "tool_calls"}]})})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
            return
        for i in range(chunks):
            if break_after is not None and i >= break_after:
                # let the chunks already sent leave the socket buffer first: an abort right
                # after a write can take unsent bytes with it, and the test is about a drop
                # after chunks that did arrive
                await asyncio.sleep(0.2)
                raise UpstreamBroke(f"dropping the connection after {i} chunks")
            if delay_s:
                await asyncio.sleep(delay_s)
            choice = ({"index": 0, "text": f"part{i} ", "finish_reason": None} if completion
                      else {"index": 0, "delta": {"content": f"part{i} "},
                            "finish_reason": None})
            chunk = {"id": "chatcmpl-fake", "object": kind, "created": int(time.time()),
                     "model": model, "choices": [choice]}
            await send({"type": "http.response.body", "more_body": True,
                        "body": b"data: " + orjson.dumps(chunk) + b"\n\n"})
        if (body.get("stream_options") or {}).get("include_usage"):
            await send({"type": "http.response.body", "more_body": True, "body": sse(
                {**base, "choices": [], "usage": usage(prompt_tokens(body), chunks)})})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if expected is not None and not any(
                (name == b"authorization" and value == expected)
                or (name == b"x-api-key" and value == anthropic_key)
                for name, value in scope["headers"]):
            await respond(send, 401, envelope("Incorrect API key provided",
                                              "authentication_error", "invalid_api_key"))
            return
        if path == "/v1/models" and method == "GET":
            await respond(send, 200, MODELS)
            return
        if path == "/v1/messages/count_tokens" and method == "POST":
            await respond(send, 200, b'{"input_tokens":7}')
            return
        if path == "/v1/messages" and method == "POST":
            if not any(name == b"anthropic-version" for name, _ in scope["headers"]):
                await respond(send, 400, orjson.dumps({"type": "error", "error": {
                    "type": "invalid_request_error",
                    "message": "anthropic-version: header is required"}}))
                return
            await messages_answer(send, orjson.loads(await read_body(receive)), chunks)
            return
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/completions",
                                            "/v1/embeddings"):
            await respond(send, 404, envelope(f"no route {method} {path}",
                                              "invalid_request_error", "not_found"))
            return
        try:
            body = orjson.loads(await read_body(receive))
        except orjson.JSONDecodeError:
            await respond(send, 400, envelope("body is not JSON", "invalid_request_error",
                                              "invalid_json"))
            return
        if fail_status:
            await respond(send, fail_status, envelope("upstream exploded", "server_error",
                                                      "boom"))
            return
        model = body.get("model")
        if arrivals is not None:  # when each chat request came (benchmarks/queue_scale.py)
            arrivals.write(f"{time.perf_counter()}\n")
        if answer_delay_ms:  # a remote that takes its time (queue benchmarks)
            await asyncio.sleep(answer_delay_ms / 1000)
        if hold_marker and hold_marker in prompt_text(body):  # in this process until killed
            if held is not None:
                held.write(f"{time.perf_counter()}\n")
            await asyncio.sleep(hold_ms / 1000)
        if path == "/v1/embeddings":
            await respond(send, 200, embeddings_answer(body, model, prompt_tokens(body)))
            return
        completion = path == "/v1/completions"
        if body.get("stream"):
            await stream(send, model, body, completion)
            return
        if body.get("tools") and not completion:
            await respond(send, 200, tool_call_answer(body, model))
            return
        text = f"echo: {prompt_text(body) if completion else last_user_text(body)}"
        choice = ({"index": 0, "finish_reason": "stop", "text": text} if completion
                  else {"index": 0, "finish_reason": "stop",
                        "message": {"role": "assistant", "content": text}})
        await respond(send, 200, orjson.dumps({
            "id": "chatcmpl-fake", "object": "text_completion" if completion
            else "chat.completion", "created": int(time.time()), "model": model,
            "choices": [choice], "usage": usage(prompt_tokens(body), 2)}))

    return app


def fastest(module: str, fallback: str) -> str:
    """``module`` when it is installed (uvloop, httptools), else uvicorn's ``fallback``."""
    return module if importlib.util.find_spec(module) is not None else fallback


def main(argv: list[str] | None = None) -> None:
    """Parse the flags and serve on 127.0.0.1 until terminated."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--require-key", help="answer 401 unless 'Bearer KEY' is sent")
    parser.add_argument("--fail-status", type=int, help="answer every chat request with this")
    parser.add_argument("--chunk-delay-ms", type=float, default=0.0,
                        help="pause before each streamed chunk")
    parser.add_argument("--chunks", type=int, default=5, help="content chunks per stream")
    parser.add_argument("--break-after", type=int,
                        help="drop the connection after this many streamed chunks")
    parser.add_argument("--answer-delay-ms", type=float, default=0.0,
                        help="pause before every chat answer")
    parser.add_argument("--arrivals-log", type=Path,
                        help="append the time.perf_counter() of every chat request's arrival")
    parser.add_argument("--count-words", action="store_true",
                        help="usage counts the prompt's words as its prompt tokens")
    parser.add_argument("--hold-marker", help="hold a request whose prompt holds this")
    parser.add_argument("--hold-ms", type=float, default=10_000.0,
                        help="how long a request with the marker is held")
    parser.add_argument("--held-log", type=Path,
                        help="append the time.perf_counter() of each held request's arrival")
    args = parser.parse_args(argv)
    import uvicorn

    arrivals = args.arrivals_log.open("a", buffering=1) if args.arrivals_log else None
    held = args.held_log.open("a", buffering=1) if args.held_log else None
    uvicorn.run(make_app(args.require_key, args.fail_status, args.chunk_delay_ms, args.chunks,
                         args.break_after, args.answer_delay_ms, arrivals,
                         args.count_words, args.hold_marker, args.hold_ms, held),
                host="127.0.0.1", port=args.port, log_level="warning", access_log=False,
                loop=fastest("uvloop", "asyncio"),
                http=fastest("httptools", "h11"), lifespan="on")


if __name__ == "__main__":
    main()
