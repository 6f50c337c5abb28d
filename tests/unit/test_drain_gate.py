"""The drain at the HTTP edge (model_boss/api/middleware/drain.py), over a bare ASGI app: refusals
while draining, and the end of a request the drain cuts, in its API's shape."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from model_boss.api.middleware.drain import DrainGate
from model_boss.slots.drain import Drain


def _scope(method: str, path: str) -> dict:
    return {"type": "http", "method": method, "path": path, "headers": [],
            "query_string": b""}


async def _receive() -> dict:
    await asyncio.sleep(3600)  # the client says nothing more
    return {"type": "http.disconnect"}


def _streaming(media: bytes, first: bytes):
    async def app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", media)]})
        await send({"type": "http.response.body", "body": first, "more_body": True})
        await asyncio.sleep(3600)  # a long answer
    return app


async def _waiting(scope, receive, send) -> None:
    await asyncio.sleep(3600)  # queued, or waiting on a whole answer


async def _serve(app, drain: Drain, method: str, path: str) -> tuple[int, dict, bytes]:
    """Run one request through the gate while ``drain`` runs (a grace of 0: cut at once)."""
    gate = DrainGate(app, SimpleNamespace(drain=drain))
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    request = asyncio.create_task(gate(_scope(method, path), _receive, send))
    await asyncio.sleep(0.01)
    await drain.run()
    await asyncio.wait_for(request, 5)
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    assert not sent[-1].get("more_body", False)  # the answer is whole: no broken connection
    return start["status"], dict(start["headers"]), body


async def test_while_draining_a_request_is_refused_but_health_and_metrics_answer():
    drain = Drain(grace_s=0)
    await drain.run()
    passed: list[str] = []

    async def app(scope, receive, send) -> None:
        passed.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    gate = DrainGate(app, SimpleNamespace(drain=drain))
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    for path in ("/v1/chat/completions", "/api/v1/status", "/health", "/metrics"):
        await gate(_scope("POST" if path.startswith("/v1") else "GET", path), _receive, send)
    assert passed == ["/health", "/metrics"]
    refusals = [m for m in sent if m["type"] == "http.response.start" and m["status"] == 503]
    assert len(refusals) == 2
    assert (b"retry-after", b"5") in refusals[0]["headers"]
    assert drain.requests == set()


@pytest.mark.parametrize(("path", "media", "ends"), [
    ("/v1/chat/completions", b"text/event-stream", "openai"),
    ("/v1/messages", b"text/event-stream", "anthropic"),
    ("/api/chat", b"application/x-ndjson", "ollama"),
])
async def test_a_stream_cut_ends_with_its_apis_error_and_terminator(path, media, ends):
    status, _, body = await _serve(_streaming(media, b"first\n\n"), Drain(grace_s=0), "POST",
                                   path)
    assert status == 200 and body.startswith(b"first\n\n")
    tail = body.removeprefix(b"first\n\n").decode()
    if ends == "openai":
        error, done = [line.removeprefix("data: ") for line in tail.splitlines() if line]
        assert json.loads(error)["error"]["code"] == "shutting_down" and done == "[DONE]"
    elif ends == "anthropic":
        name, data = tail.strip().splitlines()
        assert name == "event: error"
        assert json.loads(data.removeprefix("data: "))["type"] == "error"
    else:
        assert "shutting down" in json.loads(tail)["error"]


async def test_a_request_cut_before_its_answer_began_is_a_503():
    status, headers, body = await _serve(_waiting, Drain(grace_s=0), "POST", "/v1/completions")
    assert status == 503 and headers[b"retry-after"] == b"5"
    assert json.loads(body)["error"]["code"] == "shutting_down"


async def test_a_read_stream_cut_just_ends():
    status, _, body = await _serve(_streaming(b"text/event-stream", b": ping\n\n"),
                                   Drain(grace_s=0), "GET", "/api/v1/events")
    assert status == 200 and body == b": ping\n\n"
