"""Named user keys (``api_keys``): each key is a client for fair share, queue limits and its
profile; ``api_key`` keeps working; bad key settings name the file and the field."""

from __future__ import annotations

import json

import pytest
from pydantic import SecretStr
from starlette.datastructures import Headers
from starlette.testclient import TestClient, WebSocketDenialResponse

from model_boss.api.app import create_app
from model_boss.api.middleware.keys import KeyCheck, check_key, given_key, identity
from model_boss.errors import ConfigError
from model_boss.settings import Settings, load_settings
from model_boss.tenancy.keys import KeyStore

from .fakes import coordinator, manifest, started_client


def settings(**kw) -> Settings:
    return Settings(tasks_file=None, manifests=[], **kw)


NAMED = {"api_keys": {"alice": "k-alice", "bob": "k-bob"}}


@pytest.mark.parametrize("config, given, admin, allowed, client", [
    ({}, "", False, True, None),                                  # no keys: open
    ({"api_key": "shared"}, "shared", False, True, "default"),
    ({"api_key": "shared"}, "k-alice", False, False, None),
    (NAMED, "k-alice", False, True, "alice"),
    (NAMED, "k-bob", False, True, "bob"),
    (NAMED, "", False, False, None),
    (NAMED, "k-alic", False, False, None),                        # a prefix is no key
    ({**NAMED, "api_key": "shared"}, "shared", False, True, "default"),  # the shared key
    (NAMED, "k-alice", True, True, "alice"),       # no admin key: /api/* takes user keys
    ({**NAMED, "admin_api_key": "adm"}, "k-alice", True, False, None),
    ({**NAMED, "admin_api_key": "adm"}, "adm", True, True, "admin"),
    ({"admin_api_key": "adm"}, "", False, True, None),           # only /api/* guarded
])
def test_check_key(config, given, admin, allowed, client):
    checked = check_key(given, KeyStore(settings(**config), None), admin=admin)
    assert (checked.allowed, checked.client) == (allowed, client)


ALICE = KeyStore(settings(**NAMED), None).lookup("k-alice")


@pytest.mark.parametrize(("record", "sent", "key", "end_user", "client"), [
    (None, None, None, None, None),  # no key decided, no client named
    (None, "team-x", None, "team-x", "team-x"),  # without a key, the client it names
    ("alice", None, "alice", None, "alice"),  # a key is its client
    ("alice", "bob", "alice", "bob", "alice"),  # a client named under a key labels an end user
    ("alice", '{"device_id": "d", "session_id": "s-1"}', "alice", "s-1", "alice"),
    ("alice", "x" * 300, "alice", "x" * 200, "alice"),  # a label is cut, never the key
])
def test_the_identity_the_edge_decides(record, sent, key, end_user, client):
    headers = Headers({"x-client-id": sent} if sent is not None else {})
    who = identity(KeyCheck(True, ALICE if record else None), headers)
    assert (who.key, who.end_user, who.client, who.keyed) == (key, end_user, client,
                                                             key is not None)


@pytest.mark.parametrize(("headers", "key"), [
    ({}, ""),
    ({"authorization": "Bearer k-a"}, "k-a"),
    ({"x-api-key": "k-x"}, "k-x"),
    ({"authorization": "Bearer k-a", "x-api-key": "k-x"}, "k-a"),
    ({"sec-websocket-protocol": "realtime, openai-insecure-api-key.k-s"}, "k-s"),
    ({"sec-websocket-protocol": "openai-insecure-api-key.k-s,realtime"}, "k-s"),
    ({"sec-websocket-protocol": "realtime"}, ""),
    ({"sec-websocket-protocol": "openai-insecure-api-key.k-s", "x-api-key": "k-x"}, "k-x"),
])
def test_the_key_a_request_carries(headers, key):
    """A header first; a browser's WebSocket, which cannot set one, offers its key as a
    subprotocol (OpenAI's browser clients' way)."""
    assert given_key(Headers(headers)) == key


@pytest.mark.parametrize(("key", "status", "words"), [
    ("nope", 401, "API key"),
    ("k-alice", 404, "'talk' does not exist"),  # alice's scope: the pipeline is outside it
    ("k-bob", 503, "pipeline.transcriber: no model 'ears'"),  # bob sees it: not servable
])
def test_a_websockets_subprotocol_key_decides_as_a_header_would(tmp_path, key, status, words):
    talk = {"id": "talk", "category": "realtime",
            "pipeline": {"transcriber": "ears", "llm": "a", "voice": "mouth"}}
    coord, _ = coordinator(tmp_path, [manifest("a", 1000), talk], **NAMED,
                           clients={"alice": {"allowed_models": ["a"]}})
    client = TestClient(create_app(coordinator=coord), base_url="http://127.0.0.1")
    with pytest.raises(WebSocketDenialResponse) as refused:
        with client.websocket_connect(
                "ws://127.0.0.1/v1/realtime?model=talk",
                subprotocols=["realtime", f"openai-insecure-api-key.{key}"]):
            pass
    assert refused.value.status_code == status
    assert words in refused.value.json()["error"]["message"]


def test_keys_are_secret_in_settings():
    loaded = settings(**NAMED)
    assert isinstance(loaded.api_keys["alice"], SecretStr)
    assert "k-alice" not in repr(loaded)


def test_a_duplicate_key_is_named_not_shown(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("api_keys:\n  alice: sk-secret-1\n  bob: sk-secret-1\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    assert "api_keys.bob: the same key as api_keys.alice" in caught.value.message
    assert "sk-secret-1" not in caught.value.message


def test_keys_from_the_environment(monkeypatch):
    monkeypatch.setenv("MODEL_BOSS_API_KEYS", '{"alice": "k-alice"}')
    assert load_settings(tasks_file=None).api_keys["alice"].get_secret_value() == "k-alice"


CHAT = {"messages": [{"role": "user", "content": "hi"}]}


async def test_each_key_is_its_client_through_the_api(tmp_path):
    coord, _ = coordinator(
        tmp_path, [manifest("a", 1000), manifest("b", 1000)],
        api_keys={"alice": "k-alice", "bob": "k-bob"}, api_key="shared",
        admin_api_key="adm", clients={"alice": {"allowed_models": ["a"]}})
    async with started_client(coord) as client:
        def post(key, model, **extra):
            return client.post("/v1/chat/completions", json={"model": model, **CHAT, **extra},
                               headers={"authorization": f"Bearer {key}"})

        assert (await post("k-alice", "a")).status_code == 200
        refused = await post("k-alice", "b")  # alice's profile: 'b' is as if it did not exist
        assert refused.status_code == 404
        assert refused.json()["error"]["code"] == "model_not_found"
        # a client id under the key is an end user's label: it cannot take another profile
        assert (await post("k-alice", "b", x_client_id="bob")).status_code == 404
        assert (await post("k-bob", "b")).status_code == 200
        assert (await post("shared", "b")).status_code == 200
        assert (await post("k-bob", "a", x_client_id="team-x")).status_code == 200
        assert (await post("nope", "a")).status_code == 401
        assert (await client.get("/api/v1/status",
                                 headers={"authorization": "Bearer k-alice"})).status_code == 401
        ollama = await client.post("/api/chat", headers={"authorization": "Bearer k-bob"},
                                   json={"model": "a", **CHAT, "stream": False})
        assert ollama.status_code == 200
    log = [json.loads(line) for line in
           (tmp_path / "state" / "requests.jsonl").read_text().splitlines()]
    assert [(e["model"], e["client_id"]) for e in log] == [
        ("a", "alice"), ("b", "bob"), ("b", "default"), ("a", "bob"), ("a", "bob")]
