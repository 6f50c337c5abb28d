"""A minimal, fast OpenAI-compatible server: the stand-in for a cloud remote.

    python -m tests.fake_upstream --port N [--require-key KEY] [--fail-status 500]
        [--chunk-delay-ms 0] [--chunks 5]

Chat answers echo the last user message and the model name received; streams send
``--chunks`` chunks, ``--chunk-delay-ms`` apart, then ``[DONE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import orjson


def make_app(require_key: str | None, fail_status: int | None, chunk_delay_ms: float,
             chunks: int):
    async def read_body(receive) -> bytes:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                return body

    async def respond(send, status: int, payload: bytes,
                      content_type: bytes = b"application/json") -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", content_type),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})

    def envelope(message: str, kind: str, code: str) -> bytes:
        return orjson.dumps({"error": {"message": message, "type": kind, "param": None,
                                       "code": code}})

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path, method = scope["path"], scope["method"]
        headers = dict(scope["headers"])
        if require_key and headers.get(b"authorization") != f"Bearer {require_key}".encode():
            await respond(send, 401, envelope("bad key", "authentication_error",
                                              "invalid_api_key"))
            return
        if path == "/v1/models" and method == "GET":
            await respond(send, 200, b'{"object":"list","data":[{"id":"remote-x",'
                                     b'"object":"model"}]}')
            return
        if path != "/v1/chat/completions" or method != "POST":
            await respond(send, 404, envelope("no such route", "invalid_request_error",
                                              "not_found"))
            return
        body = orjson.loads(await read_body(receive))
        if fail_status:
            await respond(send, fail_status, envelope("upstream exploded", "server_error",
                                                      "boom"))
            return
        text = next((m.get("content", "") for m in reversed(body.get("messages", []))
                     if m.get("role") == "user"), "")
        model = body.get("model")
        if not body.get("stream"):
            await respond(send, 200, orjson.dumps({
                "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                "model": model, "choices": [{"index": 0, "finish_reason": "stop",
                                             "message": {"role": "assistant",
                                                         "content": f"echo: {text}"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}))
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for i in range(chunks):
            if chunk_delay_ms:
                await asyncio.sleep(chunk_delay_ms / 1000)
            chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": model,
                     "choices": [{"index": 0, "delta": {"content": f"part{i} "},
                                  "finish_reason": None}]}
            await send({"type": "http.response.body", "more_body": True,
                        "body": b"data: " + orjson.dumps(chunk) + b"\n\n"})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--require-key")
    parser.add_argument("--fail-status", type=int)
    parser.add_argument("--chunk-delay-ms", type=float, default=0.0)
    parser.add_argument("--chunks", type=int, default=5)
    args = parser.parse_args()
    import uvicorn

    uvicorn.run(make_app(args.require_key, args.fail_status, args.chunk_delay_ms, args.chunks),
                host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
