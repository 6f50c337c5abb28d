"""Scheduling users can trust, on real llama.cpp workers and a declared GPU that holds one of
two models: aging ends starvation (and may evict what a priority-0 client left warm), fair
share serves a single request among the first few after another client's burst (and after
another end user's burst under the same key), a key's ``end_user_limits`` refuse one end
user while another is served, and a model's concurrency and queue limits make the rest wait
or answer 429. Aging runs at 0.5 s per level here so the bound is seconds, not tens of
seconds. Requests carry API keys: the shared ``api_key`` with ``x_client_id``, or a client's
own key from ``api_keys``."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from model_boss.scheduling.ordering import wait_bound_s
from tests.conftest import ServerProcess, llama_manifest, wait_for

pytestmark = pytest.mark.slow

AGING_S = 0.25
SHARED = {"authorization": "Bearer k-shared"}
KEYS = {"flood": "k-flood", "single": "k-single",  # api_keys: each key is its client
        "app": "k-app", "rated-app": "k-rated-app"}  # keys whose end users are people
END_USER_RATE = 2  # rated-app's end users' requests per minute


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf):
    manifests = [llama_manifest("model-a", demo_gguf, vram_mb=3000),
                 llama_manifest("model-b", demo_gguf, vram_mb=3000),
                 llama_manifest("model-c", demo_gguf, vram_mb=3000, parallel=2,
                                max_concurrency=1, max_queued=1)]
    config = {"gpus": [{"index": 0, "name": "sim-4g", "vram_mb": 4096}],  # holds one
              "aging_s": AGING_S, "api_key": "k-shared", "api_keys": KEYS,
              "clients": {"rated-app": {"end_user_limits": {
                  "requests_per_minute": END_USER_RATE}}}}
    process = ServerProcess(tmp_path_factory.mktemp("sched"), config, manifests,
                            headers=SHARED).start()
    yield process
    process.stop()


def chat(server, model, client, priority=5, tokens=2, timeout=120,
         key: str | None = None) -> httpx.Response:
    """A chat as ``client`` (``x_client_id`` with the shared key), or with ``key`` alone (a
    named key, whose client it is)."""
    body = {"model": model, "max_tokens": tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": "count"}], "x_priority": priority}
    if key is None:
        body["x_client_id"] = client
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=timeout,
                      headers={"authorization": f"Bearer {key}"} if key else SHARED)


def learned(server, model) -> dict:
    return next(s for s in server.status()["slots"] if s["model"] == model)["learned"]


def test_priority_9_is_served_within_the_bound_while_priority_0_traffic_goes_on(server):
    assert chat(server, "model-a", "warmup").status_code == 200
    stop = threading.Event()
    a_done: list[float] = []

    def flood(client):
        while not stop.is_set():
            response = chat(server, "model-a", client, priority=0)
            assert response.status_code == 200, response.text
            a_done.append(time.monotonic())

    with ThreadPoolExecutor(3) as pool:
        floods = [pool.submit(flood, f"interactive-{i}") for i in range(3)]
        try:
            time.sleep(1.0)
            sent = time.monotonic()
            response = chat(server, "model-b", "batch", priority=9, timeout=60)
            waited = time.monotonic() - sent
            still_flowing = wait_for(lambda: any(t > sent + waited for t in a_done), 20)
        finally:
            stop.set()
        for future in floods:
            future.result()
    assert response.status_code == 200, response.text
    assert response.headers["x-model-boss-model"] == "model-b"
    assert still_flowing  # priority-0 traffic for A went on after B was served
    a, b = learned(server, "model-a"), learned(server, "model-b")
    # the figures the queue itself went by: A's load (its warm credit), one A request
    # running when B's turn came (the drain), B's own load
    bound = wait_bound_s(9, most_important=0, aging_s=AGING_S,
                         warm_credit_s=max(1.0, a["load_s"]), drain_s=a["infer_s"],
                         load_s=b["load_s"])
    assert waited <= bound * 1.5 + 2.0, (waited, bound, a, b)  # EWMAs on a shared box
    assert waited >= 9 * AGING_S, waited  # ... and priority still counted
    events = httpx.get(server.url + "/api/v1/events?stream=false",
                       headers=SHARED).json()["events"]
    assert any(e["type"] == "evicted" and e["model"] == "model-a" and e["last_priority"] == 0
               for e in events)


def test_a_single_request_after_another_clients_burst_is_among_the_first_few(server):
    """The two clients are told apart by their keys alone (``api_keys``)."""
    assert chat(server, "model-a", "warmup").status_code == 200
    finished: list[str] = []
    lock = threading.Lock()

    def one(client, tag):
        response = chat(server, "model-a", client, tokens=16, key=KEYS[client])
        assert response.status_code == 200, response.text
        with lock:
            finished.append(tag)

    with ThreadPoolExecutor(13) as pool:
        burst = [pool.submit(one, "flood", f"burst-{i}") for i in range(12)]
        wait_for(lambda: server.status()["queue"]["depth"] >= 4, 10)
        time.sleep(0.5 - 0.1)
        with lock:
            done_before = len(finished)
        single = pool.submit(one, "single", "single")
        for future in [*burst, single]:
            future.result()
    assert len(finished) == 13
    # of the burst still there when it came, only the one running, the first waiting and
    # (on a slow box, where it came over fair_share_turn_s later) the next finish before it;
    # first come, first served made it the last of all
    assert finished.index("single") - done_before <= 3, (done_before, finished)
    served = {c["client_id"]: c["succeeded"] for c in server.status()["queue"]["clients"]}
    assert served["flood"] >= 12 and served["single"] >= 1, served


def end_user_chat(server, key: str, end_user: str, *, by_header: bool, tokens=16,
                  ) -> httpx.Response:
    """A chat under ``key`` for ``end_user``: named by ``X-Client-Id``, or by ``user``."""
    body = {"model": "model-a", "max_tokens": tokens, "ignore_eos": True, "x_priority": 5,
            "messages": [{"role": "user", "content": "count"}]}
    headers = {"authorization": f"Bearer {key}"}
    if by_header:
        headers["x-client-id"] = end_user
    else:
        body["user"] = end_user
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120,
                      headers=headers)


def test_one_end_users_single_request_after_anothers_burst_under_one_key(server):
    """One key, two end users: the bound the test above holds between keys holds between a
    key's end users (fair share in two levels)."""
    assert chat(server, "model-a", "warmup").status_code == 200
    finished: list[str] = []
    lock = threading.Lock()

    def one(end_user, tag, by_header):
        response = end_user_chat(server, KEYS["app"], end_user, by_header=by_header)
        assert response.status_code == 200, response.text
        with lock:
            finished.append(tag)

    with ThreadPoolExecutor(13) as pool:
        burst = [pool.submit(one, "ann", f"burst-{i}", True) for i in range(12)]
        wait_for(lambda: server.status()["queue"]["depth"] >= 4, 10)
        time.sleep(0.5 - 0.1)
        with lock:
            done_before = len(finished)
        single = pool.submit(one, "bob", "single", False)
        for future in [*burst, single]:
            future.result()
    assert len(finished) == 13
    assert finished.index("single") - done_before <= 3, (done_before, finished)


def test_an_end_user_over_its_limits_is_refused_while_another_is_served(server):
    key = KEYS["rated-app"]
    for _ in range(END_USER_RATE):
        assert end_user_chat(server, key, "ann", by_header=True, tokens=2).status_code == 200
    refused = end_user_chat(server, key, "ann", by_header=False, tokens=2)
    assert refused.status_code == 429, refused.text
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    error = refused.json()["error"]
    assert error["code"] == "rate_limited"
    assert "end user 'ann' of key 'rated-app'" in error["message"]
    served = end_user_chat(server, key, "bob", by_header=True, tokens=2)
    assert served.status_code == 200, served.text


def test_max_concurrency_makes_the_rest_wait_and_max_queued_answers_429(server):
    def model_c():
        status = server.status()
        slot = next((s for s in status["slots"] if s["model"] == "model-c"), {})
        waiting = [w for w in status["queue"]["waiting"] if w["model"] == "model-c"]
        return slot.get("state"), slot.get("active_requests"), len(waiting)

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(chat, server, "model-c", "c1", 5, 100)
        wait_for(lambda: model_c() == ("ready", 1, 0), 30)
        # parallel: 2, but max_concurrency: 1 — the second request waits
        second = pool.submit(chat, server, "model-c", "c2", 5, 100)
        wait_for(lambda: model_c() == ("ready", 1, 1), 10)
        refused = chat(server, "model-c", "c3")  # max_queued: 1 is full
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["retry-after"]) >= 1
        error = refused.json()["error"]
        assert error["code"] == "model_queue_full" and "model-c" in error["message"]
        for future in (first, second):
            assert future.result().status_code == 200
    metrics = httpx.get(server.url + "/metrics").text
    assert 'model_boss_queue_rejected_total{model="model-c",reason="model_queue_full"} 1.0' \
        in metrics
    assert 'model_boss_model_max_concurrency{model="model-c"} 1.0' in metrics
    assert 'model_boss_queue_wait_seconds_count{priority="9"} 1.0' in metrics
