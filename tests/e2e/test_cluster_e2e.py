"""Three real coordinators sharing one real Redis, each with its own declared GPU and port.

One cluster for the module; the tests run in order and build on each other's state: a burst
to all three loads a model once (through the load lock when each has room, by the same
choice when one has); a model warm on C is served through A (streaming, C's refusals as
they are); a model nowhere loads on the member with room; a forward without the secret is
refused; ps --cluster; a Redis restart is repaired within a heartbeat; a job cancelled
through one member stops where it runs; runtime config and learned figures are shared; a
member SIGKILLed mid-job: the job completes once on another member, its leases expire and
its model is served elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis

from model_boss.cli import main as cli_main
from model_boss.gpu.redis_store import RedisLeaseStore
from tests.conftest import (
    RedisServer,
    ServerProcess,
    llama_manifest,
    served_stream,
    sse_events,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.redis]

SECRET = "cluster-test-secret"
HEARTBEAT_S = 0.5
# eight heartbeats: a member busy on a saturated 2-core box (the rest of the suite runs beside
# this module) must not drop out of the others' view and back between two requests
MEMBER_TTL_S = 4.0
MODELS = ("m1", "m2", "m3")


def chat(model: str, **extra) -> dict:
    return {"model": model, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": "hi"}], **extra}


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("cluster-redis"))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def members(tmp_path_factory, demo_gguf, redis_server):
    manifests = [llama_manifest(m, demo_gguf, vram_mb=3000) for m in MODELS]
    servers = {}
    for host in "abc":
        servers[host] = ServerProcess(
            tmp_path_factory.mktemp(f"member-{host}"),
            {"redis_url": redis_server.url, "cluster": True, "host_id": host,
             "cluster_heartbeat_s": HEARTBEAT_S, "cluster_member_ttl_s": MEMBER_TTL_S,
             "cluster_load_lock_s": 10.0, "cluster_job_claim_s": 2.0, "lease_ttl_s": MEMBER_TTL_S,
             "gpus": [{"index": 0, "name": f"sim-{host}", "vram_mb": 4096}]},
            manifests, env={"MODEL_BOSS_CLUSTER_SECRET": SECRET})
    try:
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda s: s.start(60), servers.values()))
        wait_for(lambda: all(len(cluster(s)["members"]) == 3 for s in servers.values()),
                 timeout=10)
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def cluster(server: ServerProcess) -> dict:
    return httpx.get(server.url + "/api/v1/cluster", timeout=10).json()


def where(server: ServerProcess, model: str) -> dict[str, str]:
    return {p["host_id"]: p["state"] for p in cluster(server)["models"].get(model, [])}


def loads(server: ServerProcess, model: str) -> int:
    return sum(s["loads"] for s in server.status()["slots"] if s["model"] == model)


def burst(servers: list[ServerProcess], model: str, each: int = 3) -> list[httpx.Response]:
    """``each`` requests for ``model`` to every one of ``servers``, all at once."""
    async def send() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=90) as client:
            return await asyncio.gather(*[
                client.post(s.url + "/v1/chat/completions", json=chat(model))
                for s in servers for _ in range(each)])

    return asyncio.run(send())


def test_a_burst_where_every_member_has_room_loads_once(members):
    """Each member would load it itself (room everywhere, a tie goes to the asking member):
    the load lock names one loader and the others send their requests there."""
    servers = list(members.values())
    answers = burst(servers, "m3")
    assert [r.status_code for r in answers] == [200] * 9, [r.text for r in answers]
    loaders = {r.headers["x-model-boss-member"] for r in answers}
    assert len(loaders) == 1
    assert sum(loads(s, "m3") for s in servers) == 1
    loader = members[loaders.pop()]
    assert httpx.post(loader.url + "/api/v1/models/m3/unload", timeout=30).status_code == 200
    wait_for(lambda: all(where(s, "m3") == {} for s in servers), timeout=10)


def test_a_model_warm_on_c_is_served_through_a_streaming(members):
    a, c = members["a"], members["c"]
    assert httpx.post(c.url + "/api/v1/models/m1/load", timeout=60).status_code == 200
    wait_for(lambda: where(a, "m1") == {"c": "ready"}, timeout=10)
    with httpx.stream("POST", a.url + "/v1/chat/completions", timeout=60,
                      json=chat("m1", stream=True, max_tokens=8, ignore_eos=True,
                                x_client_id="team-x", x_priority=2)) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["x-model-boss-member"] == "c"
        assert response.headers["content-type"].startswith("text/event-stream")
        text = "\n".join(response.iter_lines())
    assert served_stream(text), text  # an error event (a failure on C) then [DONE] fails
    choices = [e["choices"][0] for e in sse_events(text)[:-1] if e.get("choices")]
    assert len([c for c in choices if c["delta"].get("content")]) >= 3, text
    assert choices[-1]["finish_reason"] == "length", text  # all 8 tokens came through
    assert "m1" not in {s["model"] for s in a.status()["slots"]}  # nothing loaded on A
    clients = {c["client_id"]: c for c in c.status()["queue"]["clients"]}
    assert "team-x" in clients  # the client id reached C
    too_long = chat("m1", x_client_id="too-long")
    too_long["messages"][0]["content"] = "x " * 3000  # C's worker refuses it: C's 400 as is
    refused = httpx.post(a.url + "/v1/chat/completions", json=too_long, timeout=60)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["type"] == "exceed_context_size_error"  # the worker's own
    clients = {c["client_id"]: c for c in c.status()["queue"]["clients"]}
    assert clients["too-long"]["client_errors"] == 1  # refused on C, not on A


def test_a_model_nowhere_loads_on_the_member_with_room(members):
    a, b = members["a"], members["b"]
    lease = httpx.post(a.url + "/api/v1/leases", json={"vram_mb": 3000, "gpu": 0,
                                                       "kind": "training"}, timeout=10)
    assert lease.status_code in (200, 201), lease.text
    try:
        wait_for(lambda: cluster(b)["members"][0]["free_mb"]["0"] < 3000, timeout=10)
        response = httpx.post(a.url + "/v1/chat/completions", json=chat("m2"), timeout=60)
        assert response.status_code == 200, response.text
        assert response.headers["x-model-boss-member"] == "b"
        assert [s["state"] for s in b.status()["slots"] if s["model"] == "m2"] == ["ready"]
        assert "m2" not in {s["model"] for s in a.status()["slots"]}
    finally:
        httpx.delete(a.url + f"/api/v1/leases/{lease.json()['id']}", timeout=10)


def test_the_same_burst_to_all_three_loads_once_where_there_is_room(members):
    servers = list(members.values())
    # every member must have seen the outside lease on A go (the previous test's): a member
    # still holding A's older record would rightly count A as full and load it itself
    wait_for(lambda: all(m["free_mb"]["0"] >= 3000 for s in servers
                         for m in cluster(s)["members"] if m["host_id"] == "a"), timeout=10)

    before = sum(loads(s, "m3") for s in servers)  # the first burst loaded it once
    answers = burst(servers, "m3")
    assert [r.status_code for r in answers] == [200] * 9, [r.text for r in answers]
    assert {r.headers["x-model-boss-member"] for r in answers} == {"a"}
    assert sum(loads(s, "m3") for s in servers) == before + 1


def test_a_forward_without_the_secret_is_refused(members):
    a = members["a"]
    for headers in ({"x-model-boss-forwarded": "evil"},
                    {"x-model-boss-forwarded": "evil", "x-model-boss-cluster-secret": "no"}):
        response = httpx.post(a.url + "/v1/chat/completions", json=chat("m3"),
                              headers=headers, timeout=10)
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "forward_refused"
    member_headers = {"x-model-boss-forwarded": "b", "x-model-boss-cluster-secret": SECRET}
    ok = httpx.post(a.url + "/v1/chat/completions", json=chat("m3"), timeout=60,
                    headers=member_headers)
    assert ok.status_code == 200
    # the secret opens inference routes only, never the admin API
    admin = httpx.post(a.url + "/api/v1/models/m3/unload", headers=member_headers, timeout=10)
    assert admin.status_code == 403 and admin.json()["error"]["code"] == "forward_refused"


def test_ps_cluster_shows_every_member_and_model(members, capsys):
    assert cli_main(["--url", members["b"].url, "ps", "--cluster"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert {line.split()[0] for line in lines[1:4]} == {"a", "b", "c"}
    rows = {tuple(line.split()[:4]) for line in lines}
    assert {("m1", "c", "ready", "gpu"), ("m2", "b", "ready", "gpu"),
            ("m3", "a", "ready", "gpu")} <= rows


def test_redis_restart_members_reregister_within_a_heartbeat(members, redis_server):
    a, c = members["a"], members["c"]
    lease_id = next(s["lease"]["id"] for s in c.status()["slots"] if s["model"] == "m1")
    redis_server.restart()

    async def c_leases() -> list[str]:
        store = RedisLeaseStore(redis_server.url, prefix="model-boss:host:c")
        try:
            return [lease.id for lease in await store.list()]
        finally:
            await store.close()

    # one heartbeat (plus the reconnect) after Redis is back, all is as it was
    wait_for(lambda: len(cluster(a)["members"]) == 3 and where(a, "m1") == {"c": "ready"}
             and asyncio.run(c_leases()) == [lease_id], timeout=4 * HEARTBEAT_S + 2)
    response = httpx.post(a.url + "/v1/chat/completions", json=chat("m1"), timeout=60)
    assert response.status_code == 200 and response.headers["x-model-boss-member"] == "c"


def test_a_job_cancelled_on_one_member_stops_where_it_runs(members):
    a, b = members["a"], members["b"]
    # every member sees m2 warm on b (the Redis restart before may have left a view behind)
    wait_for(lambda: all(where(s, "m2") == {"b": "ready"} for s in members.values()),
             timeout=10, what=lambda: {n: where(s, "m2") for n, s in members.items()})
    body = chat("m2", max_tokens=1000, ignore_eos=True, x_client_id="cancel-me")
    job = httpx.post(a.url + "/api/v1/jobs", timeout=10,
                     json={"endpoint": "/v1/chat/completions", "body": body}).json()
    job_url = a.url + f"/api/v1/jobs/{job['id']}"
    seen: list[dict] = []

    def running() -> bool:
        seen.append(httpx.get(job_url, timeout=10).json())
        return seen[-1]["status"] == "running"

    wait_for(running, timeout=30, what=lambda: {"the job never ran": seen[-1:]})
    ran = httpx.get(job_url, timeout=10).json()
    assert ran["member"] == "b", ran  # m2 is warm there
    assert httpx.delete(job_url, timeout=10).json()["status"] == "cancelled"

    def stopped_on_b() -> bool:
        stats = {c["client_id"]: c for c in b.status()["queue"]["clients"]}
        return stats["cancel-me"]["in_flight"] == 0
    wait_for(stopped_on_b, timeout=10, what=lambda: {
        "b's queue clients": b.status()["queue"]["clients"],
        "job": httpx.get(job_url, timeout=10).json()})
    assert httpx.get(job_url, timeout=10).json()["status"] == "cancelled"


def test_runtime_config_and_learned_figures_are_shared(members, redis_server):
    a, b, c = members["a"], members["b"], members["c"]

    def fallback(server: ServerProcess) -> bool:
        return httpx.get(server.url + "/api/v1/config", timeout=10).json()["allowCloudFallback"]

    try:
        assert httpx.put(a.url + "/api/v1/config", json={"allowCloudFallback": False},
                         timeout=10).status_code == 200
        wait_for(lambda: not fallback(b) and not fallback(c), timeout=5)
    finally:
        httpx.put(a.url + "/api/v1/config", json={"allowCloudFallback": True}, timeout=10)
    wait_for(lambda: fallback(b) and fallback(c), timeout=5)
    client = redis.Redis.from_url(redis_server.url)
    try:  # each model's cold load, measured where it happened, is in the shared figures
        shared = wait_for(lambda: (h := client.hgetall("model-boss:cluster:learned"))
                          and {k.decode() for k in h} >= {"m1", "m2", "m3"} and h, timeout=10)
        assert all(json.loads(v)["load_s"] > 0 for v in shared.values())
    finally:
        client.close()


def test_a_member_killed_mid_job(members, redis_server):
    """The job C took (m1 is warm there) completes on another member, once; C's leases
    expire with it; m1 is served elsewhere after a reload."""
    a, c = members["a"], members["c"]
    # m1 warm on C alone in every member's view (any member reads the job streams, and one
    # that has not yet seen m1 warm on C reads m1's too), and each member's blocking read of
    # the streams, begun before it saw that, over (it lasts one heartbeat)
    wait_for(lambda: all(where(m, "m1") == {"c": "ready"} for m in members.values()),
             timeout=10, what=lambda: {h: cluster(m)["models"] for h, m in members.items()})
    time.sleep(2 * HEARTBEAT_S)
    # long enough that C cannot finish it between being seen running and being killed
    body = chat("m1", max_tokens=200, ignore_eos=True)
    submitted = httpx.post(a.url + "/api/v1/jobs", timeout=10,
                           json={"endpoint": "/v1/chat/completions", "body": body})
    assert submitted.status_code == 202, submitted.text
    job_url = a.url + f"/api/v1/jobs/{submitted.json()['id']}"
    seen: list[dict] = []

    def running_on_c() -> bool:
        seen.append(httpx.get(job_url, timeout=10).json())
        return seen[-1]["status"] == "running" and seen[-1]["member"] == "c"

    wait_for(running_on_c, timeout=30, what=lambda: seen[-1:])
    c.stop(signal.SIGKILL)

    async def c_leases() -> list:
        store = RedisLeaseStore(redis_server.url, prefix="model-boss:host:c")
        try:
            return await store.list()
        finally:
            await store.close()

    wait_for(lambda: {m["host_id"] for m in cluster(a)["members"]} == {"a", "b"}, timeout=10,
             what=lambda: cluster(a)["members"])
    wait_for(lambda: asyncio.run(c_leases()) == [], timeout=10,  # expired with it
             what=lambda: asyncio.run(c_leases()))
    try:
        done = wait_for(lambda: (j := httpx.get(job_url, timeout=10).json())["status"]
                        in ("succeeded", "failed", "cancelled") and j, timeout=120)
    except AssertionError:
        raise AssertionError(f"{httpx.get(job_url).json()}\nA:\n{a.log()}\nB:\n"
                             f"{members['b'].log()}") from None
    assert done["status"] == "succeeded", done
    assert done["member"] in ("a", "b")
    assert done["result"]["usage"]["completion_tokens"] == 200
    client = redis.Redis.from_url(redis_server.url)
    try:
        wait_for(lambda: client.xpending("model-boss:cluster:jobs:m1", "members")["pending"]
                 == 0, timeout=10,
                 what=lambda: client.xpending("model-boss:cluster:jobs:m1", "members"))
        assert httpx.get(job_url, timeout=10).json()["finished_at"] == done["finished_at"]
    finally:
        client.close()
    response = httpx.post(a.url + "/v1/chat/completions", json=chat("m1"), timeout=90)
    assert response.status_code == 200, response.text
    assert response.headers["x-model-boss-member"] in ("a", "b")
