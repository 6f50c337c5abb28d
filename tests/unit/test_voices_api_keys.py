"""``/api/v1/voices`` under keys: a voice belongs to its model's scope (a key that cannot see
the model cannot see, add or delete its voices: 404, as if it did not exist), a wrong key is a
401, and a key deletes only the voices it added (an admin's any)."""

from __future__ import annotations

import importlib.util

import pytest
from starlette.testclient import TestClient

from model_boss.api.app import create_app
from tests.unit.fakes import coordinator, manifest
from tests.unit.test_voice_store import recording, vibevoice_folder

pytestmark = pytest.mark.skipif(importlib.util.find_spec("av") is None,
                                reason="PyAV (the 'transformers' extra) decodes recordings")


@pytest.fixture
def client(tmp_path):
    folder = vibevoice_folder(tmp_path / "vv", "narrator")
    coord, _ = coordinator(
        tmp_path, [manifest("vv", 1000, category="tts", backend="transformers",
                            path=str(folder)), manifest("chat", 1000)],
        api_keys={"alice": "k-alice", "bob": "k-bob", "carol": "k-carol"},
        admin_api_key="k-root",
        clients={"alice": {"allowed_models": ["vv"]}, "carol": {"allowed_models": ["vv"]},
                 "bob": {"allowed_models": ["chat"]}})
    with TestClient(create_app(coordinator=coord), base_url="http://127.0.0.1") as client:
        yield client


def _as(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _add(client, key: str, name: str):
    return client.post("/api/v1/voices", headers=_as(key), data={"model": "vv", "name": name},
                       files={"file": (f"{name}.wav", recording(1), "audio/wav")})


def test_a_voice_is_seen_added_and_deleted_within_its_models_scope(client):
    listed = client.get("/api/v1/voices?model=vv", headers=_as("k-alice"))
    assert listed.status_code == 200
    assert [v["name"] for v in listed.json()["data"]] == ["narrator"]
    assert _add(client, "k-alice", "mine").status_code == 201

    # bob's scope leaves the model out: its voices do not exist for him
    for answer in (client.get("/api/v1/voices?model=vv", headers=_as("k-bob")),
                   _add(client, "k-bob", "his"),
                   client.delete("/api/v1/voices/mine?model=vv", headers=_as("k-bob"))):
        assert answer.status_code == 404, answer.text
        assert "'vv' does not exist" in answer.json()["error"]["message"]
    assert client.get("/api/v1/voices", headers=_as("k-bob")).json()["data"] == []
    wrong = client.get("/api/v1/voices", headers=_as("k-nobody"))
    assert wrong.status_code == 401

    # carol sees alice's voice (same model, same scope) but may not delete it; the admin may
    refused = client.delete("/api/v1/voices/mine?model=vv", headers=_as("k-carol"))
    assert refused.status_code == 403 and refused.json()["error"]["param"] == "name"
    assert client.delete("/api/v1/voices/mine?model=vv", headers=_as("k-root")).json() == \
        {"name": "mine", "model": "vv", "deleted": True}
    names = [v["name"] for v in client.get("/api/v1/voices?model=vv",
                                           headers=_as("k-alice")).json()["data"]]
    assert names == ["narrator"]
