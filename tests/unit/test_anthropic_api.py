"""``/v1/messages`` in-process (httpx.ASGITransport) over in-process backends: Anthropic's
envelope for a forbidden model and for every 503 (with ``Retry-After``), tasks and the
client headers through the queue as on every route; and CORS for a configured origin list."""

from __future__ import annotations

import json

import httpx
import orjson
import pytest

from model_boss.backends.base import UpstreamResponse
from model_boss.errors import LoadFailed
from model_boss.services.anthropic import error_body

from .fakes import FakeBackend, coordinator, manifest, started_client

USER = {"x-api-key": "user-key", "anthropic-version": "2023-06-01"}
HI = [{"role": "user", "content": "hi"}]
CHAT_ANSWER = orjson.dumps({"choices": [{"message": {"role": "assistant", "content": "yo"},
                                         "finish_reason": "stop"}],
                            "usage": {"prompt_tokens": 3, "completion_tokens": 1}})


def message(model: str, **extra) -> dict:
    return {"model": model, "max_tokens": 5, "messages": HI, **extra}


def anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == kind and body["error"]["message"]
    return body["error"]["message"]


@pytest.fixture
async def api(tmp_path, monkeypatch):
    async def chat(self, endpoint, body, stream):  # a worker that speaks chat completions
        return UpstreamResponse(200, {"content-type": "application/json"}, body=CHAT_ANSWER)

    monkeypatch.setattr(FakeBackend, "handle_request", chat)
    (tmp_path / "tasks.yaml").write_text("tasks:\n  helper:\n    candidates: [b, a]\n")
    coord, _ = coordinator(
        tmp_path, [manifest("a", 1000), manifest("b", 1000),
                   manifest("gone", 1000, path=str(tmp_path / "missing.gguf"))],
        api_key="user-key", api_keys={"walled": "walled-key"},
        tasks_file=tmp_path / "tasks.yaml", clients={"walled": {"allowed_models": ["a"]}})
    async with started_client(coord) as client:
        yield client, coord


async def test_a_model_outside_the_keys_scope_does_not_exist(api):
    client, coord = api
    walled = {**USER, "x-api-key": "walled-key"}
    refused = await client.post("/v1/messages", json=message("b"), headers=walled)
    assert "'b'" in anthropic_error(refused, 404, "not_found_error")
    # the key decides: neither a client id nor metadata.user_id widens it
    claimed = await client.post("/v1/messages", json={**message("b"),
                                                      "metadata": {"user_id": "bob"}},
                                headers={**walled, "x-client-id": "bob"})
    anthropic_error(claimed, 404, "not_found_error")
    assert coord.queue.depth == 0
    allowed = await client.post("/v1/messages", json=message("a"), headers=walled)
    assert allowed.status_code == 200 and allowed.json()["content"][0]["text"] == "yo"


async def test_a_model_that_cannot_be_served_is_overloaded_with_retry_after(api):
    client, _ = api
    response = await client.post("/v1/messages", json=message("gone"), headers=USER)
    assert "missing.gguf" in anthropic_error(response, 503, "overloaded_error")
    assert int(response.headers["retry-after"]) >= 1


async def test_a_load_that_fails_is_overloaded_with_retry_after(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("a", 1000)], api_key="user-key",
                           backend_kwargs={"fail": LoadFailed("the worker never started")})
    async with started_client(coord) as client:
        for streamed in (False, True):
            response = await client.post("/v1/messages", json=message("a", stream=streamed),
                                         headers=USER)
            anthropic_error(response, 503, "overloaded_error")
            assert int(response.headers["retry-after"]) >= 1
        # and in OpenAI's envelope on the other routes, with the same header
        chat = await client.post("/v1/chat/completions", headers=USER,
                                 json={"model": "a", "messages": HI})
        assert chat.status_code == 503 and chat.json()["error"]["code"] == "model_load_failed"
        assert int(chat.headers["retry-after"]) >= 1


@pytest.mark.parametrize("status, kind", [
    (409, "invalid_request_error"),  # model_busy, model_not_loaded: the client's to wait out
    (410, "invalid_request_error"),  # any other 4xx: never api_error
    (503, "overloaded_error"), (502, "api_error"), (500, "api_error"),
])
def test_statuses_as_anthropic_error_types(status: int, kind: str) -> None:
    assert error_body(status, "m")["error"]["type"] == kind


@pytest.mark.parametrize("where", ["body", "header"])
async def test_task_and_client_headers_reach_the_queue(api, monkeypatch, where):
    client, coord = api
    seen = []
    acquire = coord.queue.acquire

    async def spy(request):
        seen.append((request.model_id, request.task, request.priority, request.client_id,
                     request.end_user))
        return await acquire(request)

    monkeypatch.setattr(coord.queue, "acquire", spy)
    body, headers = message("task:helper"), dict(USER)
    if where == "body":
        body.update(metadata={"user_id": "ide"}, x_priority=1)
    else:
        headers.update({"x-priority": "1", "x-client-id": "ide"})
    response = await client.post("/v1/messages", json=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["x-model-boss-model"] == "b"  # the task's first candidate
    # with keys, the queue counts the key; the client id is the end user's label under it
    assert seen == [("b", "helper", 1, "default", "ide")]


CLAUDE_CODE_USER = json.dumps({"device_id": "d" * 64, "account_uuid": "",
                               "session_id": "3f2b0c1e-0000-4000-8000-000000000000"})


@pytest.mark.parametrize("sent, label", [
    (CLAUDE_CODE_USER, "3f2b0c1e-0000-4000-8000-000000000000"),  # its session, not the blob
    (json.dumps({"user_id": "ana", "session_id": "s1"}), "ana"),
    ("{not json", "{not json"), ("ide", "ide")])
async def test_an_end_user_sent_as_json_is_labelled_readably(api, monkeypatch, sent, label):
    """Claude Code's ``metadata.user_id`` is a JSON object in a string: the end user label is
    its ``user_id`` (or ``account_uuid``, or ``session_id``) field, not the whole blob."""
    client, coord = api
    seen = []
    acquire = coord.queue.acquire

    async def spy(request):
        seen.append(request.end_user)
        return await acquire(request)

    monkeypatch.setattr(coord.queue, "acquire", spy)
    body = {**message("b"), "metadata": {"user_id": sent}}
    response = await client.post("/v1/messages", json=body, headers=USER)
    assert response.status_code == 200, response.text
    assert seen == [label]


async def test_an_unknown_task_is_not_found(api):
    client, _ = api
    response = await client.post("/v1/messages", json=message("task:nope"), headers=USER)
    anthropic_error(response, 404, "not_found_error")


# --- CORS, as cors_origins configures it ----------------------------------------------------

def preflight(origin: str) -> dict:
    return {"origin": origin, "access-control-request-method": "POST",
            "access-control-request-headers": "x-api-key, content-type"}


@pytest.mark.parametrize("origins, allowed, refused", [
    (["https://app.example"], ["https://app.example"],
     ["http://localhost:5173", "https://evil.example", "https://app.example:8443"]),
    (["http://tool.lan:*"], ["http://tool.lan", "http://tool.lan:3000"],
     ["https://tool.lan", "http://localhost"]),
    (["*"], ["https://anything.example", "http://localhost:1"], []),
])
async def test_cors_for_the_configured_origins(tmp_path, origins, allowed, refused):
    coord, _ = coordinator(tmp_path, [manifest("a", 1000)], api_key="user-key",
                           cors_origins=origins)
    async with started_client(coord) as client:
        for origin in allowed:
            answer = await client.options("/v1/messages", headers=preflight(origin))
            assert answer.status_code == 200, (origin, answer.text)
            assert answer.headers["access-control-allow-origin"] in (origin, "*")
            served = await client.post("/v1/messages", json=message("a"),
                                       headers={**USER, "origin": origin})
            assert served.status_code == 200
            assert served.headers["access-control-allow-origin"] in (origin, "*")
            assert "x-model-boss-model" in served.headers["access-control-expose-headers"]
        for origin in refused:
            answer = await client.options("/v1/messages", headers=preflight(origin))
            assert "access-control-allow-origin" not in answer.headers, origin
            served = await client.post("/v1/messages", json=message("a"),
                                       headers={**USER, "origin": origin})
            assert "access-control-allow-origin" not in served.headers, origin
