"""Ollama's routes in-process (httpx.ASGITransport) over in-process backends: keys, Ollama's
error envelope with the right status, priorities through the queue, load and unload."""

from __future__ import annotations

import json

import httpx
import pytest

from model_boss.api.app import create_app
from model_boss.backends.base import UpstreamResponse
from model_boss.errors import CapacityExceeded, RateLimited

from .fakes import FakeBackend, coordinator, manifest

USER = {"authorization": "Bearer user-key"}
ADMIN = {"authorization": "Bearer admin-key"}
HI = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "stream": False}


@pytest.fixture
async def api(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("a", 1000, aliases=["a:7b"], embeddings=True),
                                      manifest("b", 1000)],
                           api_key="user-key", admin_api_key="admin-key", max_body_bytes=4096)
    app = create_app(coordinator=coord)
    await coord.start()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://127.0.0.1") as client:
        yield client, coord
    await coord.stop()


def ollama_error(response: httpx.Response, status: int) -> str:
    """The body is Ollama's envelope: one key, a string."""
    assert response.status_code == status, response.text
    body = response.json()
    assert list(body) == ["error"] and isinstance(body["error"], str) and body["error"]
    return body["error"]


async def test_ollama_routes_take_the_user_key_not_the_admin_key(api):
    client, _ = api
    assert "API key" in ollama_error(await client.post("/api/chat", json=HI), 401)
    assert (await client.post("/api/chat", json=HI, headers=USER)).status_code == 200
    for path in ("/api/tags", "/api/ps", "/api/version"):
        assert (await client.get(path, headers=USER)).status_code == 200
        ollama_error(await client.get(path), 401)
    # the admin routes under /api/v1 keep the admin key
    assert (await client.get("/api/v1/status", headers=USER)).status_code == 401


@pytest.mark.parametrize("path, body, status, words", [
    ("/api/chat", b"{not json", 400, "JSON"),
    ("/api/chat", b'{"messages": []}', 400, "model"),
    ("/api/chat", b'{"model": "zzz", "messages": []}', 404, "zzz"),
    ("/api/chat", b'{"model": "a", "messages": "hi"}', 400, "messages"),
    ("/api/chat", b'{"model": "a", "keep_alive": "soon"}', 400, "keep_alive"),
    ("/api/chat", b'{"model": "a", "format": "yaml", "messages": []}', 400, "format"),
    ("/api/chat", b'{"model": "a", "options": {"temperature": "hot"}, "messages": []}', 400,
     "temperature"),
    ("/api/generate", b'{"model": "a", "prompt": "x", "suffix": "y"}', 400, "suffix"),
    ("/api/generate", b'{"model": "a", "prompt": "x", "images": ["iVBOR"]}', 400, "images"),
    ("/api/embed", b'{"model": "a"}', 400, "input"),
    ("/api/embeddings", b'{"model": "zzz", "prompt": "x"}', 404, "zzz"),
    ("/api/show", b"{}", 400, "model"),
    ("/api/show", b'{"model": "zzz"}', 404, "zzz"),
    ("/api/push", b'{"model": "a"}', 400, "manifest"),
    ("/api/create", b'{"model": "x", "from": "a"}', 400, "manifest"),
    ("/api/copy", b'{"source": "a", "destination": "c"}', 400, "manifest"),
    ("/api/blobs/sha256:abc", b"", 400, "manifest"),
])
async def test_errors_use_ollamas_envelope_and_status(api, path, body, status, words):
    client, _ = api
    response = await client.post(path, content=body, headers=USER)
    assert words in ollama_error(response, status)


async def test_pull_and_delete_need_the_admin_key_and_answer_in_ollamas_envelope(api):
    client, _ = api
    for method, path in (("POST", "/api/pull"), ("DELETE", "/api/delete")):
        denied = await client.request(method, path, json={"model": "a"}, headers=USER)
        assert "API key" in ollama_error(denied, 401)
    unknown = await client.post("/api/pull", json={"model": "llama3"}, headers=ADMIN)
    assert "hf.co/ORG/REPO:QUANT" in ollama_error(unknown, 404)
    assert "model" in ollama_error(await client.post("/api/pull", json={}, headers=ADMIN), 400)
    served = await client.post("/api/pull", json={"model": "a", "stream": False},
                               headers=ADMIN)
    assert served.json() == {"status": "success"}  # as Ollama answers for a model it has
    refused = await client.request("DELETE", "/api/delete", json={"model": "a"}, headers=ADMIN)
    assert "manifest" in ollama_error(refused, 400)
    gone = await client.request("DELETE", "/api/delete", json={"model": "zzz"}, headers=ADMIN)
    assert "zzz" in ollama_error(gone, 404)
    ollama_error(await client.get("/api/chat", headers=USER), 405)


async def test_a_body_over_the_limit_is_a_413_in_ollamas_envelope(api):
    client, _ = api
    big = {**HI, "messages": [{"role": "user", "content": "x" * 8000}]}
    ollama_error(await client.post("/api/chat", json=big, headers=USER), 413)


@pytest.mark.parametrize("error, status", [
    (CapacityExceeded("the queue is full", retry_after_s=5, code="queue_full"), 503),
    (RateLimited("too many requests from 'x'", retry_after_s=2), 429)])
@pytest.mark.parametrize("path, body", [("/api/chat", HI), ("/api/generate", {
    "model": "a", "prompt": "hi"}), ("/api/embed", {"model": "a", "input": "hi"})])
async def test_a_full_queue_or_a_rate_limit_keeps_status_and_retry_after(
        api, monkeypatch, error, status, path, body):
    client, coord = api

    async def refuse(request):
        raise error

    monkeypatch.setattr(coord.queue, "acquire", refuse)
    response = await client.post(path, json=body, headers=USER)
    assert error.message in ollama_error(response, status)
    assert response.headers["retry-after"] == str(round(error.retry_after_s))


@pytest.mark.parametrize("where", ["body", "header"])
async def test_priority_and_client_reach_the_queue_as_on_the_openai_routes(api, monkeypatch,
                                                                           where):
    client, coord = api
    seen = []
    acquire = coord.queue.acquire

    async def spy(request):
        seen.append((request.priority, request.client_id, request.end_user,
                     request.keep_alive_s))
        return await acquire(request)

    monkeypatch.setattr(coord.queue, "acquire", spy)
    body = {**HI, "keep_alive": "10m"}
    headers = dict(USER)
    if where == "body":
        body.update(x_priority=1, x_client_id="ide")
    else:
        headers.update({"x-priority": "1", "x-client-id": "ide"})
    assert (await client.post("/api/chat", json=body, headers=headers)).status_code == 200
    # with keys the queue counts the key; the client id labels an end user under it
    assert seen == [(1, "default", "ide", 600.0)]


async def test_empty_requests_load_and_keep_alive_0_unloads(api):
    client, coord = api
    loaded = await client.post("/api/generate", json={"model": "a:7b", "stream": False},
                               headers=USER)
    assert loaded.json()["done_reason"] == "load" and loaded.json()["model"] == "a:7b"
    assert coord.pool.slots["a"].state == "ready"
    ps = (await client.get("/api/ps", headers=USER)).json()["models"]
    assert [m["name"] for m in ps] == ["a"] and ps[0]["size_vram"] == 1000 * 2**20
    assert ps[0]["processor"] == "100% GPU (declared)" and ps[0]["expires_at"]
    gone = await client.post("/api/chat", json={"model": "a:latest", "keep_alive": 0},
                             headers=USER)
    assert gone.headers["content-type"] == "application/x-ndjson"
    assert gone.json()["done_reason"] == "unload"
    assert coord.pool.slots["a"].state == "idle"
    assert (await client.get("/api/ps", headers=USER)).json() == {"models": []}


async def test_tags_list_every_manifest_with_its_aliases(api):
    client, _ = api
    models = (await client.get("/api/tags", headers=USER)).json()["models"]
    assert {m["name"]: m["aliases"] for m in models} == {"a": ["a:7b"], "b": []}
    assert all(len(m["digest"]) == 64 and m["modified_at"] for m in models)


async def test_a_stream_is_ndjson_and_its_slot_is_released(api, monkeypatch):
    client, coord = api
    seen = []

    async def streaming(self, endpoint, body, stream):
        seen.append((endpoint, body))

        async def chunks():
            yield b'data: {"choices": [{"delta": {"content": "Hel"}}]}\n\n'
            yield (b'data: {"choices": [{"delta": {"content": "lo"}, "finish_reason": "stop"}],'
                   b' "timings": {"predicted_ms": 5.0}}\n\n')
            yield (b'data: {"choices": [], "usage": {"prompt_tokens": 3,'
                   b' "completion_tokens": 2}}\n\n')
            yield b"data: [DONE]\n\n"

        return UpstreamResponse(200, {"content-type": "text/event-stream"}, stream=chunks())

    monkeypatch.setattr(FakeBackend, "handle_request", streaming)
    body = {**HI, "stream": True, "options": {"num_predict": 5, "seed": 3, "top_k": 9}}
    response = await client.post("/api/chat", json=body, headers=USER)
    assert response.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert [line["message"]["content"] for line in lines] == ["Hel", "lo", ""]
    assert lines[-1]["done"] and lines[-1]["eval_count"] == 2
    assert lines[-1]["eval_duration"] == 5_000_000
    endpoint, sent = seen[0]
    assert endpoint == "/v1/chat/completions" and sent["stream"] is True
    assert (sent["max_tokens"], sent["seed"], sent["top_k"]) == (5, 3, 9)
    assert sent["stream_options"] == {"include_usage": True}
    assert coord.pool.slots["a"].active == 0
