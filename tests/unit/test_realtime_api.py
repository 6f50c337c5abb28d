"""``/v1/realtime``'s door: the key (checked at the edge, as for any route) and the key's
scope over the pipeline are decided before the socket is accepted, and refused as HTTP
answers in the error envelope."""

from __future__ import annotations

import importlib.util
import time

import pytest
from starlette.testclient import TestClient, WebSocketDenialResponse

from model_boss.api.app import create_app

from .fakes import coordinator, manifest, started_client

TALK = {"id": "talk", "category": "realtime",
        "pipeline": {"transcriber": "ears", "llm": "a", "voice": "mouth"}}


@pytest.mark.parametrize(("key", "model", "status", "words"), [
    (None, "talk", 401, "API key"),
    ("nope", "talk", 401, "API key"),
    ("k-alice", "talk", 404, "'talk' does not exist"),  # outside alice's scope
    ("k-bob", "talk", 503, "pipeline.transcriber: no model 'ears'"),
    ("k-bob", "a", 400, "not a realtime pipeline"),
    ("k-bob", "", 400, "model: required"),
])
def test_a_session_is_refused_before_it_opens(tmp_path, key, model, status, words):
    coord, _ = coordinator(tmp_path, [manifest("a", 1000), TALK],
                           api_keys={"alice": "k-alice", "bob": "k-bob"},
                           clients={"alice": {"allowed_models": ["a"]}})
    client = TestClient(create_app(coordinator=coord), base_url="http://127.0.0.1")
    headers = {"authorization": f"Bearer {key}"} if key else {}
    with pytest.raises(WebSocketDenialResponse) as refused:
        with client.websocket_connect(f"ws://127.0.0.1/v1/realtime?model={model}", headers=headers):
            pass
    assert refused.value.status_code == status
    assert words in refused.value.json()["error"]["message"]


@pytest.mark.skipif(importlib.util.find_spec("silero_vad") is None,
                    reason="the 'realtime' extra")
async def test_a_pipeline_is_no_model_of_another_route_and_status_lists_it(tmp_path):
    members = [manifest(name, 1000, category=kind, backend="command", command=["true"])
               for name, kind in (("ears", "stt"), ("mouth", "tts"))]
    coord, _ = coordinator(tmp_path, [manifest("a", 1000), *members, TALK,
                                      {**TALK, "id": "mute", "pipeline": {**TALK["pipeline"],
                                                                         "voice": "ears"}}])
    async with started_client(coord) as client:
        chat = await client.post("/v1/chat/completions", json={
            "model": "talk", "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 400
        assert chat.json()["error"]["code"] == "unsupported_endpoint"
        assert "realtime pipeline" in chat.json()["error"]["message"]
        status = await client.get("/api/v1/status")
        assert status.status_code == 200
        models = {m["id"]: m for m in status.json()["models"]}
        assert models["talk"]["available"] is True
        assert models["mute"]["unavailable_reason"] == \
            "pipeline.voice: 'ears' is a stt model, not tts"


def _members(sizes: dict[str, int]) -> list[dict]:
    kinds = {"ears": "stt", "mouth": "tts"}
    return [manifest(name, mb, category=kinds[name], backend="command", command=["true"])
            if name in kinds else manifest(name, mb) for name, mb in sizes.items()]


@pytest.mark.parametrize(("case", "sizes", "clients", "status", "words"), [
    ("three that cannot be on the GPU together", {"a": 2000, "ears": 1000, "mouth": 800},
     {}, 503, "'mouth' needs 800 MB of VRAM beside 'a', 'ears'"),
    ("a key not scoped to the realtime kind", {"a": 1000, "ears": 500, "mouth": 500},
     {"bob": {"endpoints": ["chat", "audio"]}}, 403, "may not call realtime routes"),
])
def test_a_session_that_cannot_be_served_is_refused_before_it_opens(tmp_path, case, sizes,
                                                                    clients, status, words):
    coord, _ = coordinator(tmp_path, [*_members(sizes), TALK], api_keys={"bob": "k-bob"},
                           clients=clients)
    with TestClient(create_app(coordinator=coord), base_url="http://127.0.0.1") as client:
        with pytest.raises(WebSocketDenialResponse) as refused:
            with client.websocket_connect("ws://127.0.0.1/v1/realtime?model=talk",
                                          headers={"authorization": "Bearer k-bob"}):
                pass
        assert refused.value.status_code == status, case
        assert words in refused.value.json()["error"]["message"], case
        assert not any(slot["held_by"] for slot in client.get(
            "/api/v1/status", headers={"authorization": "Bearer k-bob"}).json()["slots"])


@pytest.mark.skipif(importlib.util.find_spec("silero_vad") is None,
                    reason="the 'realtime' extra")
def test_an_open_session_holds_its_models_warm_and_lets_them_go(tmp_path):
    coord, _ = coordinator(tmp_path, [*_members({"a": 1000, "ears": 500, "mouth": 500}), TALK],
                           api_keys={"bob": "k-bob"},
                           clients={"bob": {"requests_per_minute": 5, "priority": 3}})
    key = {"authorization": "Bearer k-bob"}
    with TestClient(create_app(coordinator=coord), base_url="http://127.0.0.1") as client:
        with client.websocket_connect("ws://127.0.0.1/v1/realtime?model=talk",
                                      headers=key) as socket:
            created = socket.receive_json()
            assert created["type"] == "session.created"
            status = client.get("/api/v1/status", headers=key).json()
            [session] = status["realtime_sessions"]
            assert (session["id"], session["model"], session["key"], session["priority"]) == \
                (created["session"]["id"], "talk", "bob", 3)
            assert sorted(session["models"]) == ["a", "ears", "mouth"]
            slots = {slot["model"]: slot for slot in status["slots"]}
            assert all(slots[m]["held_by"] == [session["id"]] for m in ("a", "ears", "mouth"))
            # held: none of them expires while the session is open
            assert all(slots[m]["unload_at"] is None for m in ("a", "ears", "mouth"))
        for _ in range(100):  # the server ends its side once the client has gone
            status = client.get("/api/v1/status", headers=key).json()
            if not status["realtime_sessions"]:
                break
            time.sleep(0.05)
        assert status["realtime_sessions"] == []
        slots = {slot["model"]: slot for slot in status["slots"]}
        assert all(slots[m]["held_by"] == [] and slots[m]["unload_at"] is not None
                   for m in ("a", "ears", "mouth"))
