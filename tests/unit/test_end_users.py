"""End users under one key: fair share in two levels (between keys, then between a key's end
users), and a key's ``end_user_limits`` refused with 429 in each API's envelope while the
key's other end users are served. Without keys the client id stays the client, as before."""

from __future__ import annotations

import argparse
import asyncio

import orjson
import pytest

from model_boss.backends.base import UpstreamResponse
from model_boss.cli import keys as keys_cli
from model_boss.errors import RateLimited
from model_boss.scheduling.queue import QueuedRequest
from model_boss.settings import END_USER_LIMITS, EndUserLimits
from model_boss.tenancy.keys import EndUserAdmission
from model_boss.tenancy.usage import Spent, UsageLedger, UsageRow

from .fakes import FakeBackend, coordinator, manifest, started_client

ADMIN = {"authorization": "Bearer adm"}
CHAT = {"model": "qwen-a", "messages": [{"role": "user", "content": "hi"}]}


def bearer(secret: str, end_user: str | None = None) -> dict[str, str]:
    headers = {"authorization": f"Bearer {secret}"}
    return headers | ({"x-client-id": end_user} if end_user else {})


@pytest.fixture
async def api(tmp_path, monkeypatch):
    """A box with an admin key; each answer reports 10 tokens."""
    async def answer(self, endpoint, body, stream):
        await asyncio.sleep(0.01)
        return UpstreamResponse(200, {"content-type": "application/json"}, body=orjson.dumps(
            {"object": "chat.completion", "model": body.get("model"),
             "choices": [{"message": {"role": "assistant", "content": "hi"}}],
             "usage": {"prompt_tokens": 5, "completion_tokens": 5}}))

    monkeypatch.setattr(FakeBackend, "handle_request", answer)
    coord, _ = coordinator(tmp_path, [manifest("qwen-a", 1000)], admin_api_key="adm")
    async with started_client(coord) as client:
        yield client, coord


async def make_key(client, name: str, **terms) -> str:
    created = await client.post("/api/v1/keys", json={"name": name, **terms}, headers=ADMIN)
    assert created.status_code == 201, created.text
    return created.json()["key"]


# --- the limits, through the API ---------------------------------------------------------

async def test_an_end_user_over_its_rate_is_refused_in_each_envelope_while_another_is_served(
        api):
    client, coord = api
    secret = await make_key(client, "app", end_user_limits={"requests_per_minute": 2})
    listed = (await client.get("/api/v1/keys/app", headers=ADMIN)).json()
    assert listed["end_user_limits"] == {"requests_per_minute": 2}
    for _ in range(2):
        assert (await client.post("/v1/chat/completions", json=CHAT,
                                  headers=bearer(secret, "ann"))).status_code == 200
    over = await client.post("/v1/chat/completions", json=CHAT, headers=bearer(secret, "ann"))
    assert over.status_code == 429, over.text
    error = over.json()["error"]
    assert error["code"] == "rate_limited" and "end user 'ann' of key 'app'" in error["message"]
    assert 1 <= int(over.headers["retry-after"]) <= 60
    # the same end user named by the body: OpenAI's ``user``, Anthropic's metadata.user_id
    by_user = await client.post("/v1/chat/completions", json={**CHAT, "user": "ann"},
                                headers=bearer(secret))
    assert by_user.status_code == 429
    anthropic = await client.post("/v1/messages", headers=bearer(secret), json={
        "model": "qwen-a", "max_tokens": 5, "metadata": {"user_id": "ann"},
        "messages": [{"role": "user", "content": "hi"}]})
    assert anthropic.status_code == 429, anthropic.text
    assert anthropic.json()["error"]["type"] == "rate_limit_error"
    assert "retry-after" in anthropic.headers
    ollama = await client.post("/api/chat", headers=bearer(secret, "ann"),
                               json={**CHAT, "stream": False})
    assert ollama.status_code == 429 and "end user 'ann'" in ollama.json()["error"]
    # another end user of the same key, and the key without an end user, are served
    for headers, body in ((bearer(secret, "bob"), CHAT), (bearer(secret), {**CHAT, "user": "cy"}),
                          (bearer(secret), CHAT)):
        served = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert served.status_code == 200, served.text


async def test_an_end_users_tokens_per_day(api):
    client, coord = api
    secret = await make_key(client, "daily", end_user_limits={"tokens_per_day": 1})
    assert (await client.post("/v1/chat/completions", json=CHAT,
                              headers=bearer(secret, "ann"))).status_code == 200
    await coord.usage.flush()
    spent = await client.post("/v1/chat/completions", json=CHAT, headers=bearer(secret, "ann"))
    assert spent.status_code == 429, spent.text
    error = spent.json()["error"]
    assert error["code"] == "quota_exceeded" and error["param"] == "tokens_per_day"
    assert "end user 'ann' of key 'daily'" in error["message"]
    assert (await client.post("/v1/chat/completions", json=CHAT,
                              headers=bearer(secret, "bob"))).status_code == 200
    cleared = await client.patch("/api/v1/keys/daily", json={"end_user_limits": None},
                                 headers=ADMIN)
    assert cleared.status_code == 200 and "end_user_limits" not in cleared.json()
    assert (await client.post("/v1/chat/completions", json=CHAT,
                              headers=bearer(secret, "ann"))).status_code == 200


async def test_an_end_users_queue_limit_through_the_api(api):
    """``max_queued: 0`` refuses every named end user in the queue's own 429; a request that
    names none is the key's alone and is served."""
    client, _ = api
    secret = await make_key(client, "queued", end_user_limits={"max_queued": 0})
    refused = await client.post("/v1/chat/completions", json=CHAT,
                                headers=bearer(secret, "ann"))
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "end_user_queue_full"
    assert int(refused.headers["retry-after"]) >= 1
    ollama = await client.post("/api/chat", headers=bearer(secret, "ann"),
                               json={**CHAT, "stream": False})
    assert ollama.status_code == 429 and "end user 'ann'" in ollama.json()["error"]
    assert (await client.post("/v1/chat/completions", json=CHAT,
                              headers=bearer(secret))).status_code == 200


async def test_a_bad_end_user_limit_is_a_400_naming_it(api):
    client, _ = api
    bad = await client.post("/api/v1/keys", headers=ADMIN, json={
        "name": "bad", "end_user_limits": {"max_concurrency": 0}})
    assert bad.status_code == 400 and "max_concurrency" in bad.text
    unknown = await client.post("/api/v1/keys", headers=ADMIN, json={
        "name": "bad", "end_user_limits": {"gpu_seconds_per_day": 1}})
    assert unknown.status_code == 400


# --- the limits, in the queue --------------------------------------------------------------

def keyed(end_user: str, key: str = "app", **kw) -> QueuedRequest:
    return QueuedRequest(model_id="a", priority=5, client_id=key, key=key, end_user=end_user,
                         **kw)


async def test_an_end_users_max_queued_and_max_concurrency(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("a", parallel=4)])
    await coord.start()
    try:
        limits = {"end_user_max_concurrency": 1, "end_user_max_queued": 1}
        first = await asyncio.wait_for(coord.queue.acquire(keyed("ann", **limits)), 2)
        # ann's second waits for her first though the slot has room; bob's is served
        second = asyncio.create_task(coord.queue.acquire(keyed("ann", **limits)))
        await asyncio.sleep(0.05)
        assert not second.done() and coord.queue.depth == 1
        with pytest.raises(RateLimited) as refused:  # her share of the queue is full
            await coord.queue.acquire(keyed("ann", **limits))
        assert refused.value.code == "end_user_queue_full"
        assert refused.value.retry_after_s is not None
        bob = await asyncio.wait_for(coord.queue.acquire(keyed("bob", **limits)), 2)
        first.release()
        (await asyncio.wait_for(second, 2)).release()
        bob.release()
    finally:
        await coord.stop()


# --- fair share in two levels ---------------------------------------------------------------

async def served_order(tmp_path, requests: list[QueuedRequest]) -> list[str]:
    """``requests`` queued in turn behind a running one on a slot that serves one at a
    time; the end users (or clients) in the order they are granted."""
    coord, _ = coordinator(tmp_path, [manifest("a", parallel=1)])
    await coord.start()
    try:
        running = await asyncio.wait_for(coord.queue.acquire(
            QueuedRequest(model_id="a", priority=5, client_id="warm")), 2)
        waiting = []
        for request in requests:
            waiting.append(asyncio.create_task(coord.queue.acquire(request)))
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.05)
        order = [r.end_user or r.client_id for r in coord.queue.ordered()]
        running.release()
        granted = []
        for next_one in asyncio.as_completed(waiting, timeout=5):  # each frees the slot
            ticket = await next_one
            granted.append(ticket.request.end_user or ticket.request.client_id)
            ticket.release()
        assert granted == order  # served in the order the queue showed
        return order
    finally:
        await coord.stop()


async def test_an_end_users_single_request_after_anothers_burst_is_among_the_first_few(
        tmp_path):
    order = await served_order(tmp_path, [keyed("ann") for _ in range(12)] + [keyed("bob")])
    assert order.index("bob") <= 1, order  # ann's first, then bob's: not behind her burst
    assert order.count("ann") == 12


async def test_between_keys_fair_share_is_as_before(tmp_path):
    """Another key's single request after a key's burst from two end users: the key's place
    among keys is the one its requests held."""
    burst = [keyed("ann") for _ in range(6)] + [keyed("bob") for _ in range(6)]
    order = await served_order(tmp_path, [*burst, keyed("", key="other")])
    assert order.index("other") <= 1, order


async def test_without_keys_the_client_id_is_the_client(tmp_path):
    """No keys: the client ids are the clients (and their end user labels), as before."""
    def plain(client: str) -> QueuedRequest:
        return QueuedRequest(model_id="a", priority=5, client_id=client, end_user=client)

    order = await served_order(tmp_path, [plain("ann") for _ in range(12)] + [plain("bob")])
    assert order.index("bob") <= 1, order


# --- the pieces --------------------------------------------------------------------------------

def test_end_user_admission_counts_each_end_user_apart():
    spent = {("k", "ann"): Spent(tokens=5)}
    admission = EndUserAdmission(lambda key, end_user, since: spent.get((key, end_user),
                                                                        Spent()))
    limits = EndUserLimits(requests_per_minute=1, tokens_per_day=5)
    assert admission.admit("k", "bob", limits, now=100.0) is None
    refused = admission.admit("k", "ann", limits, now=100.0)
    assert refused is not None and refused.param == "tokens_per_day"
    assert admission.admit("k", "bob", limits, now=101.0).code == "rate_limited"
    assert admission.admit("k", "bob", limits, now=161.0) is None  # a minute later
    assert admission.admit("k", "", limits) is None  # no end user: the key's limits alone
    assert admission.admit("k", "bob", None) is None


async def test_the_ledger_keeps_each_end_users_day_across_a_restart(tmp_path):
    path = tmp_path / "usage.sqlite3"
    ledger = UsageLedger(path)
    await ledger.start()
    at = 1.8e9
    for end_user, tokens in (("ann", 3), ("ann", 4), ("bob", 1), ("", 2)):
        ledger.record(UsageRow(key="k", end_user=end_user, model="m", endpoint="/v1/chat",
                               outcome="ok", http_status=200, at=at, prompt_tokens=tokens))
    assert ledger.end_user_spent("k", "ann", at - 10).tokens == 7
    await ledger.stop()
    again = UsageLedger(path)
    await again.start()
    try:
        assert again.end_user_spent("k", "ann", at - 10).tokens == 7
        assert again.end_user_spent("k", "bob", at - 10).tokens == 1
        assert again.spent("k", at - 10).tokens == 10  # the key's own: every row of it
    finally:
        await again.stop()


def test_the_command_line_sets_end_user_limits():
    parser = argparse.ArgumentParser()
    keys_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["keys", "update", "app", "--end-user-max-queued", "3",
                              "--end-user-tokens-per-day", "1000", "--requests-per-minute", "9"])
    assert keys_cli.terms(args) == {"requests_per_minute": 9, "end_user_limits": {
        "max_queued": 3, "tokens_per_day": 1000}}
    args = parser.parse_args(["keys", "update", "app", "--end-user-max-queued", "none"])
    assert keys_cli.terms(args) == {"end_user_limits": None}
    shown = keys_cli.format_keys([{"name": "app", "end_user_limits": {"max_queued": 3}}])
    assert "end_user.max_queued=3" in shown
    assert set(END_USER_LIMITS) == set(EndUserLimits.model_fields)
