"""Keys as tenants through the API: created, changed, rotated and revoked live; a key's
scope (models, kinds of route, priority floor) that no client id widens; its rates and
quotas refused with 429 in each API's envelope; and the usage ledger's rows equal to what
the clients were told."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from model_boss.backends.base import UpstreamResponse

from .fakes import FakeBackend, coordinator, manifest, started_client

ADMIN = {"authorization": "Bearer adm"}
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


@pytest.fixture
async def api(tmp_path, monkeypatch):
    """A box with an admin key and three models; each answer tells its usage, as a real
    server does (prompt, completion and cached tokens)."""
    answered = iter(range(1, 10_000))

    async def answer(self, endpoint, body, stream):
        n = next(answered)
        usage = {"prompt_tokens": 10 + n, "completion_tokens": n,
                 "prompt_tokens_details": {"cached_tokens": n % 3}}
        if stream:
            async def chunks():
                yield b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'
                await asyncio.sleep(0.01)
                yield b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n"
                yield b"data: [DONE]\n\n"
            return UpstreamResponse(200, {"content-type": "text/event-stream"},
                                    stream=chunks())
        await asyncio.sleep(0.01)
        return UpstreamResponse(200, {"content-type": "application/json"}, body=orjson.dumps(
            {"object": "chat.completion", "model": body.get("model"),
             "choices": [{"message": {"role": "assistant", "content": "hi"}}],
             "usage": usage}))

    monkeypatch.setattr(FakeBackend, "handle_request", answer)
    coord, _ = coordinator(tmp_path, [manifest("qwen-a", 1000), manifest("qwen-b", 1000),
                                      manifest("llama-c", 1000)], admin_api_key="adm")
    async with started_client(coord) as client:
        yield client, coord


async def make_key(client, name: str, **terms) -> str:
    created = await client.post("/api/v1/keys", json={"name": name, **terms}, headers=ADMIN)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["name"] == name and body["key"].startswith("mb-")
    return body["key"]


async def test_a_key_is_created_listed_without_secret_rotated_and_revoked(api):
    client, coord = api
    secret = await make_key(client, "alice", models=["qwen*"])
    listed = (await client.get("/api/v1/keys", headers=ADMIN)).json()["keys"]
    alice = next(k for k in listed if k["name"] == "alice")
    assert alice["models"] == ["qwen*"] and "key" not in alice
    assert secret not in str(listed) and secret[7:] not in str(listed)
    stored = (coord.settings.state_path / "keys.sqlite3").read_bytes()
    assert secret.encode() not in stored  # only its hash is kept
    chat = {"model": "qwen-a", **CHAT}
    assert (await client.post("/v1/chat/completions", json=chat,
                              headers=bearer(secret))).status_code == 200
    # a user key is no admin: the key API and the status stay closed to it
    assert (await client.get("/api/v1/keys", headers=bearer(secret))).status_code == 401
    rotated = (await client.post("/api/v1/keys/alice/rotate", headers=ADMIN)).json()["key"]
    assert rotated != secret
    old = await client.post("/v1/chat/completions", json=chat, headers=bearer(secret))
    assert old.status_code == 401 and old.json()["error"]["code"] == "invalid_api_key"
    assert (await client.post("/v1/chat/completions", json=chat,
                              headers=bearer(rotated))).status_code == 200
    revoked = await client.delete("/api/v1/keys/alice", headers=ADMIN)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    refused = await client.post("/v1/chat/completions", json={**chat, "stream": True},
                                headers=bearer(rotated))
    assert refused.status_code == 401
    duplicate = await client.post("/api/v1/keys", json={"name": "admin"}, headers=ADMIN)
    assert duplicate.status_code == 409


async def test_keys_survive_a_restart(tmp_path, api):
    client, coord = api
    secret = await make_key(client, "kept", tokens_per_day=5)
    from model_boss.tenancy.keys import KeyStore

    again = KeyStore(coord.settings, coord.settings.state_path / "keys.sqlite3")
    await again.start()
    found = again.lookup(secret)
    assert found is not None and found.name == "kept"
    assert found.profile.tokens_per_day == 5


async def test_a_scoped_key_stays_scoped_whatever_ids_it_sends(api):
    client, coord = api
    secret = await make_key(client, "scoped", models=["qwen*"])
    key = bearer(secret)
    listed = (await client.get("/v1/models", headers=key)).json()["data"]
    assert sorted(m["id"] for m in listed) == ["qwen-a", "qwen-b"]
    tags = (await client.get("/api/tags", headers=key)).json()["models"]
    assert sorted(m["name"] for m in tags) == ["qwen-a", "qwen-b"]
    for claim in ({"headers": {"x-client-id": "bob"}}, {"body": {"x_client_id": "bob"}},
                  {"body": {"user": "bob"}}, {}):
        refused = await client.post(
            "/v1/chat/completions", json={"model": "llama-c", **CHAT, **claim.get("body", {})},
            headers={**key, **claim.get("headers", {})})
        assert refused.status_code == 404, claim
        assert refused.json()["error"]["code"] == "model_not_found"
    message = await client.post("/v1/messages", headers={**key, "x-client-id": "bob"}, json={
        "model": "llama-c", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"user_id": "bob"}})
    assert message.status_code == 404 and message.json()["type"] == "error"
    shown = await client.post("/api/show", json={"model": "llama-c"}, headers=key)
    assert shown.status_code == 404
    assert coord.queue.granted_total == 0


async def test_endpoint_kinds_and_the_priority_floor(api, monkeypatch):
    client, coord = api
    embeds = bearer(await make_key(client, "embedder", endpoints=["embeddings"]))
    refused = await client.post("/v1/chat/completions", json={"model": "qwen-a", **CHAT},
                                headers=embeds)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "endpoint_not_allowed"
    floored = bearer(await make_key(client, "batch", priority_floor=7))
    seen = []
    acquire = coord.queue.acquire

    async def spy(request):
        seen.append((request.client_id, request.end_user, request.priority))
        return await acquire(request)

    monkeypatch.setattr(coord.queue, "acquire", spy)
    answer = await client.post("/v1/chat/completions", headers={**floored, "x-priority": "0",
                                                                  "x-client-id": "nightly"},
                               json={"model": "qwen-a", **CHAT})
    assert answer.status_code == 200
    assert seen == [("batch", "nightly", 7)]


async def test_rates_and_quotas_answer_429_in_each_envelope(api):
    client, coord = api
    rated = bearer(await make_key(client, "rated", requests_per_minute=2))
    chat = {"model": "qwen-a", **CHAT}
    for _ in range(2):
        assert (await client.post("/v1/chat/completions", json=chat,
                                  headers=rated)).status_code == 200
    over = await client.post("/v1/chat/completions", json=chat, headers=rated)
    assert over.status_code == 429 and over.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(over.headers["retry-after"]) <= 60
    anthropic = await client.post("/v1/messages", headers=rated, json={
        "model": "qwen-a", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
    assert anthropic.status_code == 429
    assert anthropic.json()["error"]["type"] == "rate_limit_error"
    ollama = await client.post("/api/chat", headers=rated,
                               json={"model": "qwen-a", **CHAT, "stream": False})
    assert ollama.status_code == 429 and "rate" in ollama.json()["error"]

    quota = bearer(await make_key(client, "quota", tokens_per_day=1))
    first = await client.post("/v1/chat/completions", json=chat, headers=quota)
    assert first.status_code == 200  # under the quota when it started
    await coord.usage.flush()
    spent = await client.post("/v1/chat/completions", json=chat, headers=quota)
    assert spent.status_code == 429, spent.text
    error = spent.json()["error"]
    assert error["code"] == "quota_exceeded" and error["param"] == "tokens_per_day"
    assert "resets at" in error["message"]
    assert 1 <= int(spent.headers["retry-after"]) <= 86400
    assert coord.keys.get("quota").profile.tokens_per_day == 1
    raised = await client.patch("/api/v1/keys/quota", json={"tokens_per_day": None},
                                headers=ADMIN)
    assert raised.status_code == 200 and "tokens_per_day" not in raised.json()
    assert (await client.post("/v1/chat/completions", json=chat,
                              headers=quota)).status_code == 200


async def test_the_ledger_records_what_the_clients_were_told(api):
    client, coord = api
    told = {"prompt": 0, "completion": 0, "cached": 0}
    alice = bearer(await make_key(client, "alice"))
    bob = bearer(await make_key(client, "bob"))

    async def ask(key, model, stream):
        body = {"model": model, **CHAT, "stream": stream}
        if not stream:
            usage = (await client.post("/v1/chat/completions", json=body, headers=key)).json()[
                "usage"]
        else:
            async with client.stream("POST", "/v1/chat/completions", json=body,
                                     headers=key) as response:
                events = [line[6:] async for line in response.aiter_lines()
                          if line.startswith("data: {")]
            usage = orjson.loads(events[-1])["usage"]
        told["prompt"] += usage["prompt_tokens"]
        told["completion"] += usage["completion_tokens"]
        told["cached"] += usage["prompt_tokens_details"]["cached_tokens"]

    await asyncio.gather(*(ask(key, model, stream) for key in (alice, bob)
                           for model in ("qwen-a", "llama-c") for stream in (False, True)
                           for _ in range(3)))
    await coord.usage.flush()
    rows = (await client.get("/api/v1/usage?group_by=key", headers=ADMIN)).json()["rows"]
    by_key = {row["key"]: row for row in rows}
    assert set(by_key) == {"alice", "bob"}
    assert sum(r["requests"] for r in rows) == 24
    assert sum(r["prompt_tokens"] for r in rows) == told["prompt"]
    assert sum(r["completion_tokens"] for r in rows) == told["completion"]
    assert sum(r["cached_tokens"] for r in rows) == told["cached"]
    # the GPU-seconds: each slot's busy time divided among its requests, plus its load
    busy = sum(coord.queue.meter.busy_s(m) for m in ("qwen-a", "llama-c"))
    gpu = sum(r["gpu_seconds"] - r["load_seconds"] for r in rows)
    assert gpu == pytest.approx(busy, rel=1e-6, abs=1e-6)
    assert all(r["vram_mb_seconds"] > 0 for r in rows)
    own = (await client.get("/api/v1/usage?group_by=key", headers=alice)).json()["rows"]
    assert [r["key"] for r in own] == ["alice"]  # a user key sees only its own rows


async def test_a_key_submits_jobs_and_sees_only_its_own(api):
    client, coord = api
    alice = bearer(await make_key(client, "alice", models=["qwen*"]))
    bob = bearer(await make_key(client, "bob"))
    job = {"endpoint": "/v1/chat/completions",
           "body": {"model": "qwen-a", **CHAT, "x_key": "bob"}}  # no key can be claimed
    submitted = await client.post("/api/v1/jobs", json=job,
                                  headers={**alice, "x-client-id": "nightly"})
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]
    outside = await client.post("/api/v1/jobs", headers=alice, json={
        "endpoint": "/v1/chat/completions", "body": {"model": "llama-c", **CHAT}})
    assert outside.status_code == 404  # outside its scope: as if it did not exist
    for _ in range(200):
        done = (await client.get(f"/api/v1/jobs/{job_id}", headers=alice)).json()
        if done["status"] == "succeeded":
            break
        await asyncio.sleep(0.02)
    assert done["status"] == "succeeded", done
    assert (await client.get(f"/api/v1/jobs/{job_id}", headers=bob)).status_code == 404
    assert (await client.delete(f"/api/v1/jobs/{job_id}", headers=bob)).status_code == 404
    assert [j["id"] for j in (await client.get("/api/v1/jobs", headers=bob)).json()[
        "jobs"]] == []
    assert [j["id"] for j in (await client.get("/api/v1/jobs", headers=alice)).json()[
        "jobs"]] == [job_id]
    assert job_id in [j["id"] for j in (await client.get("/api/v1/jobs",
                                                         headers=ADMIN)).json()["jobs"]]
    await coord.usage.flush()
    rows = (await client.get("/api/v1/usage?group_by=key,end_user",
                             headers=ADMIN)).json()["rows"]
    assert [(r["key"], r["end_user"], r["requests"]) for r in rows] == [
        ("alice", "nightly", 1)]  # the job ran as the key it was taken from


async def test_another_keys_job_is_answered_as_a_job_that_never_existed(api):
    """The two 404s are byte-equal but for the id: the difference would tell a key which
    job ids exist."""
    client, _ = api
    alice = bearer(await make_key(client, "alice"))
    bob = bearer(await make_key(client, "bob"))
    submitted = await client.post("/api/v1/jobs", headers=alice, json={
        "endpoint": "/v1/chat/completions", "body": {"model": "qwen-a", **CHAT}})
    assert submitted.status_code == 202, submitted.text
    theirs = submitted.json()["id"]
    never = "job-" + "0" * (len(theirs) - len("job-"))
    for method in ("GET", "DELETE"):
        answers = [await client.request(method, f"/api/v1/jobs/{job_id}", headers=bob)
                   for job_id in (theirs, never)]
        assert [a.status_code for a in answers] == [404, 404]
        assert answers[0].content.replace(theirs.encode(), b"ID") == \
            answers[1].content.replace(never.encode(), b"ID"), method
        assert answers[0].json()["error"]["code"] == "job_not_found"
        assert answers[0].json()["error"]["param"] == "job_id"


async def test_the_first_key_of_a_box_without_an_admin_is_an_admin(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("qwen-a", 1000)])
    async with started_client(coord) as client:
        first = await client.post("/api/v1/keys", json={"name": "alice"})
        assert first.status_code == 400, first.text  # it would lock the key API away
        assert first.json()["error"]["code"] == "admin_key_first"
        root = await client.post("/api/v1/keys", json={"name": "root", "admin": True})
        assert root.status_code == 201
        admin = bearer(root.json()["key"])
        assert (await client.get("/api/v1/keys")).status_code == 401  # keys now enforced
        alice = await client.post("/api/v1/keys", json={"name": "alice"}, headers=admin)
        assert alice.status_code == 201
        last = await client.delete("/api/v1/keys/root", headers=admin)
        assert last.status_code == 400 and last.json()["error"]["code"] == "last_admin_key"
        demoted = await client.patch("/api/v1/keys/root", json={"admin": False},
                                     headers=admin)
        assert demoted.status_code == 400


async def test_a_job_is_checked_against_the_kind_of_route_it_runs(api):
    client, _ = api
    embedder = bearer(await make_key(client, "embedder", endpoints=["embeddings"]))
    refused = await client.post("/api/v1/jobs", headers=embedder, json={
        "endpoint": "/v1/chat/completions", "body": {"model": "qwen-a", **CHAT}})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "endpoint_not_allowed"


async def test_with_only_an_admin_key_usage_and_jobs_need_it(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("qwen-a", 1000)], admin_api_key="adm")
    async with started_client(coord) as client:
        assert (await client.get("/api/v1/usage")).status_code == 401
        assert (await client.get("/api/v1/jobs")).status_code == 401
        assert (await client.get("/api/v1/usage", headers=ADMIN)).status_code == 200
        assert (await client.post("/v1/chat/completions",
                                  json={"model": "qwen-a", **CHAT})).status_code == 200
