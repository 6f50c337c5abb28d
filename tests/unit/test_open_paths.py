"""The paths that need no key (model_boss/api/middleware/identity.py, OPEN_PATHS): ``/health``
names the ready models only to a key (within its scope), anyone else gets status and counts;
``/metrics`` is open until ``metrics_api_key`` is set, then needs it (or an admin's key)."""

from __future__ import annotations

import pytest

from .fakes import coordinator, manifest, started_client

ADMIN = {"authorization": "Bearer adm"}
ALICE = {"authorization": "Bearer sk-alice"}  # scoped to qwen*
BOB = {"authorization": "Bearer sk-bob"}


def two_models(tmp_path, **settings):
    """A coordinator of two models (``qwen-a``, ``llama-b``) with ``settings``."""
    coord, _ = coordinator(tmp_path, [manifest("qwen-a", 1000), manifest("llama-b", 1000)],
                           **settings)
    return coord


@pytest.fixture
async def keyed(tmp_path):
    coord = two_models(tmp_path, admin_api_key="adm",
                            api_keys={"alice": "sk-alice", "bob": "sk-bob"},
                            clients={"alice": {"allowed_models": ["qwen*"]}})
    async with started_client(coord) as client:
        for model in ("qwen-a", "llama-b"):
            loaded = await client.post(f"/api/v1/models/{model}/load", headers=ADMIN)
            assert loaded.status_code == 200, loaded.text
        yield client


@pytest.mark.parametrize("headers, ready", [
    ({}, None),
    ({"authorization": "Bearer wrong"}, None),
    ({"x-api-key": "nope"}, None),
    (BOB, ["llama-b", "qwen-a"]),
    (ALICE, ["qwen-a"]),  # its scope, as /v1/models lists it
    (ADMIN, ["llama-b", "qwen-a"]),
])
async def test_health_names_the_models_only_to_a_key(keyed, headers, ready):
    answer = await keyed.get("/health", headers=headers)
    assert answer.status_code == 200, answer.text
    expected = {"status": "ok", "models": 2, "ready_count": 2}
    assert answer.json() == (expected if ready is None else {**expected, "ready": ready})
    if ready is None:
        assert "qwen" not in answer.text and "llama" not in answer.text


async def test_health_without_keys_names_the_models_as_before(tmp_path):
    coord = two_models(tmp_path)
    async with started_client(coord) as client:
        await client.post("/api/v1/models/qwen-a/load")
        assert (await client.get("/health")).json() == {
            "status": "ok", "models": 2, "ready_count": 1, "ready": ["qwen-a"]}


async def test_metrics_are_open_by_default(keyed):
    answer = await keyed.get("/metrics")
    assert answer.status_code == 200 and "model_boss" in answer.text


@pytest.mark.parametrize("keys", [{}, {"admin_api_key": "adm", "api_keys": {"bob": "sk-bob"}}])
@pytest.mark.parametrize("headers, status", [
    ({}, 401),
    ({"authorization": "Bearer wrong"}, 401),
    ({"authorization": "Bearer scrape-me"}, 200),
    ({"x-api-key": "scrape-me"}, 200),
    (ADMIN, "admin"),  # 200 where an admin key exists; else a wrong key
    (BOB, 401),  # a user key is no scrape key
])
async def test_a_metrics_api_key_guards_metrics(tmp_path, keys, headers, status):
    coord = two_models(tmp_path, metrics_api_key="scrape-me", **keys)
    async with started_client(coord) as client:
        answer = await client.get("/metrics", headers=headers)
    if status == "admin":
        status = 200 if keys else 401
    assert answer.status_code == status, answer.text
    if status == 401:
        error = answer.json()["error"]
        assert error["code"] == "invalid_api_key" and "metrics_api_key" in error["message"]
    else:
        assert "model_boss" in answer.text
