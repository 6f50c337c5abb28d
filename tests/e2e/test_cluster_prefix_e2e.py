"""Two real coordinators on one real Redis, the demo model READY on both: a conversation's
second turn sent to the member that did not serve its first goes to the one that did (its
prompt blocks are in that member's record); a new conversation stays where it arrives."""

from __future__ import annotations

import httpx
import pytest

from tests.cluster_members import cluster, members_on_one_redis
from tests.conftest import ServerProcess, llama_manifest, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.redis]

SECRET = "cluster-prefix-secret"
HEARTBEAT_S = 0.5
MEMBER_TTL_S = 4.0
SYSTEM = ("You are a terse assistant on a ship. " * 30).strip()  # some four blocks


@pytest.fixture(scope="module")
def members(tmp_path_factory, demo_gguf):
    with members_on_one_redis(
            tmp_path_factory, "prefix", [llama_manifest("m1", demo_gguf, vram_mb=3000)],
            {"cluster_heartbeat_s": HEARTBEAT_S, "cluster_member_ttl_s": MEMBER_TTL_S,
             "lease_ttl_s": MEMBER_TTL_S}, SECRET) as servers:
        yield servers


def chat(server: ServerProcess, messages: list[dict]) -> httpx.Response:
    answer = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": "m1", "max_tokens": 4, "temperature": 0, "messages": messages})
    assert answer.status_code == 200, answer.text
    return answer


def test_the_next_turn_goes_where_the_conversation_was_served(members):
    a, b = members["a"], members["b"]
    for server in (a, b):  # READY on both: only the cache tells them apart
        assert httpx.post(server.url + "/api/v1/models/m1/load",
                          timeout=60).status_code == 200
    wait_for(lambda: all({p["host_id"] for p in cluster(s)["models"].get("m1", [])
                          if p["state"] == "ready"} == {"a", "b"} for s in (a, b)),
             timeout=15)

    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello?"}]
    answer = chat(a, first)
    assert answer.headers["x-model-boss-member"] == "a"
    wait_for(lambda: any(m["host_id"] == "a" and m.get("prefixes", {}).get("m1")
                         for m in cluster(b)["members"]), timeout=10)

    reply = answer.json()["choices"][0]["message"]["content"]
    second = [*first, {"role": "assistant", "content": reply},
              {"role": "user", "content": "And then?"}]
    assert chat(b, second).headers["x-model-boss-member"] == "a"

    other = [{"role": "system", "content": SYSTEM.upper()},
             {"role": "user", "content": "Hello?"}]
    assert chat(b, other).headers["x-model-boss-member"] == "b"  # nothing cached: stays
