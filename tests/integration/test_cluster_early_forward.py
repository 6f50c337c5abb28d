"""Early forwards (model_boss/api/early_forward.py) between two real members sharing one
real Redis: the model is a ``cloud`` manifest over ``tests/fake_upstream.py``, warm on B
only, so every request A takes for it is forwarded before A's routes see it.

A's answers are B's (body, status, stream chunk by chunk), keys are checked on A, client
priority and id reach B, A counts the request in its metrics, and whatever A cannot forward
at once (a body that does not parse, an unknown model) is answered by A's own routes.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx
import pytest

from tests.conftest import RedisServer, ServerProcess, free_port, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.redis]

SECRET = "early-forward-secret"
UPSTREAM_KEY = "upstream-key"
API_KEY = "client-key"
WALLED_KEY = "walled-key"
TEAM_KEY = "team-key"
AUTH = {"authorization": f"Bearer {API_KEY}"}
MODEL = "cloud:echo"


def chat(**extra) -> dict:
    return {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
            **extra}


@pytest.fixture(scope="module")
def members(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("early-forward")
    redis = RedisServer(tmp).start()
    port = free_port()
    upstream = subprocess.Popen([sys.executable, "-m", "tests.fake_upstream", "--port",
                                 str(port), "--require-key", UPSTREAM_KEY])
    manifest = {"id": MODEL, "aliases": ["echo"], "backend": "cloud", "category": "llm",
                "base_url": f"http://127.0.0.1:{port}/v1", "api_key_env": "UPSTREAM_KEY",
                "remote_model": "remote-x"}
    servers: dict[str, ServerProcess] = {}
    try:
        for host, clients in (("a", {"team": {"priority": 7}}),
                              ("b", {"team": {"priority": 7},
                                     "walled": {"allowed_models": ["something-else"]}})):
            servers[host] = ServerProcess(tmp / host, {
                "redis_url": redis.url, "cluster": True, "host_id": host, "api_key": API_KEY,
                "api_keys": {"walled": WALLED_KEY, "team": TEAM_KEY},
                "cluster_heartbeat_s": 0.5, "cluster_member_ttl_s": 2.0, "clients": clients,
                "gpus": [{"index": 0, "name": f"sim-{host}", "vram_mb": 8192}]}, [manifest],
                env={"MODEL_BOSS_CLUSTER_SECRET": SECRET, "UPSTREAM_KEY": UPSTREAM_KEY})
            servers[host].start(60)
        a, b = servers["a"], servers["b"]
        warm = httpx.post(b.url + "/v1/chat/completions", json=chat(), headers=AUTH, timeout=30)
        assert warm.status_code == 200, warm.text
        wait_for(lambda: any(p["host_id"] == "b" and p["state"] == "ready" for p in httpx.get(
            a.url + "/api/v1/cluster", headers=AUTH).json()["models"].get(MODEL, [])),
            timeout=20)
        yield a, b
    finally:
        for server in servers.values():
            server.stop()
        upstream.terminate()
        upstream.wait(10)
        redis.stop()


def metric(server: ServerProcess, prefix: str) -> float:
    """The sum of the samples of ``server``'s /metrics lines that start with ``prefix``."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(prefix))


def test_a_request_to_a_is_answered_by_b(members):
    a, _ = members
    counted = f'model_boss_requests_total{{endpoint="/v1/chat/completions",model="{MODEL}"'
    before = metric(a, counted)
    response = httpx.post(a.url + "/v1/chat/completions", json=chat(), headers=AUTH,
                          timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["x-model-boss-member"] == "b"
    assert response.headers["x-model-boss-model"] == MODEL
    assert response.json()["choices"][0]["message"]["content"] == "echo: hi"
    assert metric(a, counted) == before + 1  # A still counts what it forwarded


def test_an_alias_is_forwarded_as_the_model_it_names(members):
    a, _ = members
    response = httpx.post(a.url + "/v1/chat/completions", json=chat(model="echo"),
                          headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["x-model-boss-member"] == "b"
    assert response.json()["model"] == "remote-x"


def test_a_stream_through_a_comes_chunk_by_chunk(members):
    a, _ = members
    with httpx.stream("POST", a.url + "/v1/chat/completions", json=chat(stream=True),
                      headers=AUTH, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["x-model-boss-member"] == "b"
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert len(events) == 6 and all("part" in e for e in events[:-1])


def test_the_api_key_is_checked_before_forwarding(members):
    a, b = members
    for headers in ({}, {"authorization": "Bearer wrong"}):
        response = httpx.post(a.url + "/v1/chat/completions", json=chat(), headers=headers,
                              timeout=10)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"


def test_b_refuses_a_forward_without_the_right_secret(members):
    _, b = members
    for headers in ({"x-model-boss-forwarded": "a"},
                    {"x-model-boss-forwarded": "a", "x-model-boss-cluster-secret": "wrong"}):
        response = httpx.post(b.url + "/v1/chat/completions", json=chat(),
                              headers={**AUTH, **headers}, timeout=10)
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "forward_refused"
    # A, given a forward that claims to come from a member, checks it too (no second hop)
    forged = httpx.post(members[0].url + "/v1/chat/completions", json=chat(),
                        headers={"x-model-boss-forwarded": "b"}, timeout=10)
    assert forged.status_code == 403


def test_priority_and_client_reach_b(members):
    a, b = members
    waits = 'model_boss_queue_wait_seconds_count{priority="%d"}'
    before = {p: metric(b, waits % p) for p in (3, 7)}
    asked = httpx.post(a.url + "/v1/chat/completions", json=chat(x_priority=3), headers=AUTH,
                       timeout=30)
    assert asked.status_code == 200 and asked.headers["x-model-boss-member"] == "b"
    assert metric(b, waits % 3) == before[3] + 1
    # the team key's profile on A gives priority 7; B queues it at 7
    profiled = httpx.post(a.url + "/v1/chat/completions", json=chat(),
                          headers={"authorization": f"Bearer {TEAM_KEY}"}, timeout=30)
    assert profiled.status_code == 200 and profiled.headers["x-model-boss-member"] == "b"
    assert metric(b, waits % 7) == before[7] + 1
    # B knows this key as one limited to other models: the model does not exist for it, and
    # B's refusal comes back through A (the key A let it in with travels with the forward)
    walled = httpx.post(a.url + "/v1/chat/completions", json=chat(x_client_id="someone"),
                        headers={"authorization": f"Bearer {WALLED_KEY}"}, timeout=30)
    assert walled.status_code == 404, walled.text
    assert walled.json()["error"]["param"] == "model"
    # a client id under the shared key is only an end user's label: it takes no profile
    labelled = httpx.post(a.url + "/v1/chat/completions", json=chat(x_client_id="walled"),
                          headers=AUTH, timeout=30)
    assert labelled.status_code == 200, labelled.text


@pytest.mark.parametrize(("body", "status", "code"), [
    (b'{"model": "cloud:echo", "messages": [', 400, None),  # not JSON: A's own 400
    (b'["cloud:echo"]', 400, None),  # JSON, not an object
    (b'{"model": "cloud:echo", "messages": "hi"}', 400, None),  # B's 400, relayed
    (b'{"model": "cloud:echo", "messages": [{"role": "user", "content": "hi"}],'
     b' "x_priority": "high"}', 400, None),  # a bad extension: A's own 400
    (b'{"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}',
     404, "model_not_found"),
])
def test_bad_requests_get_the_openai_envelope(members, body, status, code):
    a, _ = members
    response = httpx.post(a.url + "/v1/chat/completions", content=body,
                          headers={**AUTH, "content-type": "application/json"}, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    if code is not None:
        assert error["code"] == code


def test_a_member_gone_unannounced_leaves_the_request_to_a(members):
    """Last: it kills B. A still has B's record (its TTL has not run out), so it tries B,
    finds nobody there, forgets B and serves the request itself."""
    a, b = members
    b.stop(signal.SIGKILL)
    response = httpx.post(a.url + "/v1/chat/completions", json=chat(), headers=AUTH,
                          timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["x-model-boss-member"] == "a"
    assert response.json()["choices"][0]["message"]["content"] == "echo: hi"
    assert "member b" in a.log() and "unreachable" in a.log()
