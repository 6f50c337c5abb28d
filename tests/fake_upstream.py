"""A minimal, fast OpenAI-compatible server: the stand-in for a cloud remote, as a real process.

    python -m tests.fake_upstream --port N [--require-key KEY] [--fail-status 500]
        [--chunk-delay-ms 0] [--chunks 5] [--break-after N]

``POST /v1/chat/completions`` answers with the last user message and the model name it
received (``echo: <text>``, ``model: <name>``); a stream sends ``--chunks`` chunks, each
after ``--chunk-delay-ms``, then ``[DONE]``. ``--break-after N`` drops the connection after N
chunks (a remote that dies mid-stream). ``GET /v1/models`` lists one model. A wrong or
missing key (with ``--require-key``) gets 401 in the OpenAI envelope.

It is also the baseline of ``benchmarks/proxy_overhead.py``, so it is a raw ASGI app with
orjson on uvicorn's fastest loop and parser, without an access log.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

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
    """The content of the last user message, or '' when there is none."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return str(message.get("content", ""))
    return ""


def make_app(require_key: str | None = None, fail_status: int | None = None,
             chunk_delay_ms: float = 0.0, chunks: int = 5,
             break_after: int | None = None) -> ASGIApp:
    """The ASGI app, configured by the command-line flags."""
    expected = f"Bearer {require_key}".encode() if require_key else None
    delay_s = chunk_delay_ms / 1000

    async def stream(send: Send, model: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"),
                                (b"cache-control", b"no-cache")]})
        for i in range(chunks):
            if break_after is not None and i >= break_after:
                # let the chunks already sent leave the socket buffer first: an abort right
                # after a write can take unsent bytes with it, and the test is about a drop
                # after chunks that did arrive
                await asyncio.sleep(0.2)
                raise UpstreamBroke(f"dropping the connection after {i} chunks")
            if delay_s:
                await asyncio.sleep(delay_s)
            chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                     "created": int(time.time()), "model": model,
                     "choices": [{"index": 0, "delta": {"content": f"part{i} "},
                                  "finish_reason": None}]}
            await send({"type": "http.response.body", "more_body": True,
                        "body": b"data: " + orjson.dumps(chunk) + b"\n\n"})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if expected is not None and not any(
                name == b"authorization" and value == expected
                for name, value in scope["headers"]):
            await respond(send, 401, envelope("Incorrect API key provided",
                                              "authentication_error", "invalid_api_key"))
            return
        if path == "/v1/models" and method == "GET":
            await respond(send, 200, MODELS)
            return
        if path != "/v1/chat/completions" or method != "POST":
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
        if body.get("stream"):
            await stream(send, model)
            return
        await respond(send, 200, orjson.dumps({
            "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant",
                                     "content": f"echo: {last_user_text(body)}"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}))

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
    args = parser.parse_args(argv)
    import uvicorn

    uvicorn.run(make_app(args.require_key, args.fail_status, args.chunk_delay_ms, args.chunks,
                         args.break_after),
                host="127.0.0.1", port=args.port, log_level="warning", access_log=False,
                loop=fastest("uvloop", "asyncio"),
                http=fastest("httptools", "h11"), lifespan="on")


if __name__ == "__main__":
    main()
