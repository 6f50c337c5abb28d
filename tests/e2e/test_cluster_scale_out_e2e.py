"""Two real coordinators on one real Redis, one GPU each, the demo model READY on the first
only: while its one copy is busy and its requests wait, the next requests make the second
member load a copy and serve (``replicas.max`` 2); with ``replicas.max`` 1 the second member
never does."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.cluster_members import cluster, members_on_one_redis
from tests.conftest import ServerProcess, llama_manifest, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.redis]

SECRET = "cluster-scale-out-secret"
HEARTBEAT_S = 0.25
MEMBER_TTL_S = 3.0
REQUESTS = 8
AT_ONCE = 4  # these fill the one copy and wait behind it; the rest come SPACING_S apart
SPACING_S = 0.4


@pytest.fixture(scope="module")
def members(tmp_path_factory, demo_gguf):
    manifests = [llama_manifest("m1", demo_gguf, vram_mb=3000, parallel=1,
                                replicas={"min": 1, "max": 2}),
                 llama_manifest("m2", demo_gguf, vram_mb=3000, parallel=1)]  # max 1
    with members_on_one_redis(
            tmp_path_factory, "scale-out", manifests,
            {"cluster_heartbeat_s": HEARTBEAT_S, "cluster_member_ttl_s": MEMBER_TTL_S,
             "lease_ttl_s": MEMBER_TTL_S, "replica_scale_wait_s": 0.5}, SECRET) as servers:
        yield servers


def ready_on(server: ServerProcess, model: str) -> set[str]:
    return {p["host_id"] for p in cluster(server)["models"].get(model, [])
            if p["state"] == "ready"}


def load_on_a(members: dict, model: str) -> None:
    a, b = members["a"], members["b"]
    assert httpx.post(a.url + f"/api/v1/models/{model}/load", timeout=60).status_code == 200
    wait_for(lambda: ready_on(b, model) == {"a"}, timeout=15)


def chat(server: ServerProcess, model: str, n: int) -> str:
    answer = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": model, "max_tokens": 48, "temperature": 0, "ignore_eos": True,
        "messages": [{"role": "user", "content": f"Count to fifty, take {n}."}]})
    assert answer.status_code == 200, answer.text
    return answer.headers["x-model-boss-member"]


def burst(server: ServerProcess, model: str) -> list[str]:
    """``REQUESTS`` chats running together: ``AT_ONCE`` of them at once, the rest arriving
    ``SPACING_S`` apart after them; who served each."""
    with ThreadPoolExecutor(REQUESTS) as pool:
        futures = []
        for n in range(REQUESTS):
            futures.append(pool.submit(chat, server, model, n))
            if n >= AT_ONCE - 1:
                time.sleep(SPACING_S)
        return [f.result() for f in futures]


def test_replicas_max_one_never_loads_a_second_copy(members):
    load_on_a(members, "m2")
    assert burst(members["a"], "m2") == ["a"] * REQUESTS
    assert ready_on(members["a"], "m2") == {"a"}
    assert httpx.post(members["a"].url + "/api/v1/models/m2/unload",
                      timeout=30).status_code == 200
    wait_for(lambda: not ready_on(members["b"], "m2"), timeout=15)


def test_a_busy_copy_with_waiting_requests_gets_one_on_the_other_member(members):
    load_on_a(members, "m1")
    served = burst(members["a"], "m1")
    assert served[:AT_ONCE] == ["a"] * AT_ONCE and "b" in served, served
    assert ready_on(members["a"], "m1") == {"a", "b"}
