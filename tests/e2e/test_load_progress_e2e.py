"""Load progress, queue position and waiter-cancel with a real llama.cpp worker on SmolLM2.

One coordinator for the module and two worker starts: one cold load watched from every side
(events, a streaming chat through the openai client and through raw httpx, the queue listing,
a job's status, ``model-boss ps --watch``), and one load abandoned by its only client: a worker
that never gets healthy (a shell with a child of its own), so the cancel always comes first.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.conftest import ServerProcess, llama_manifest, wait_for
from tests.lazy_modules import lazy

openai = lazy("openai")

pytestmark = pytest.mark.slow

STAGES = ["leasing", "starting", "loading", "warming", "ready"]
CHAT = {"model": "smol", "max_tokens": 4,
        "messages": [{"role": "user", "content": "Say hello."}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf):
    never_healthy = {"id": "slow-start", "category": "llm", "backend": "command",
                     "vram_mb": 500, "command": ["sh", "-c", "sleep 300 & wait"]}
    srv = ServerProcess(tmp_path_factory.mktemp("progress"),
                        {"gpus": [{"index": 0, "name": "sim-8g", "vram_mb": 8192}],
                         "load_comments_after_s": 0},  # a load of any length is commented
                        [llama_manifest("smol", demo_gguf), never_healthy])
    srv.start()
    yield srv
    srv.stop()


def events(server, kind: str, since: int = 0) -> list[dict]:
    data = httpx.get(f"{server.url}/api/v1/events?stream=false&since={since}").json()
    return [e for e in data["events"] if e["type"] == kind]


def last_seq(server) -> int:
    data = httpx.get(f"{server.url}/api/v1/events?stream=false").json()["events"]
    return data[-1]["seq"] if data else 0


def test_a_cold_load_seen_from_every_side(server, tmp_path):
    since = last_seq(server)
    watch_log = tmp_path / "ps-watch.txt"
    with watch_log.open("wb") as out:  # `model-boss ps --watch` follows the load live
        watcher = subprocess.Popen([sys.executable, "-m", "model_boss", "--url", server.url,
                                    "ps", "--watch"], stdout=out, stderr=subprocess.STDOUT)
    wait_for(lambda: "updated" in watch_log.read_text(), timeout=30)
    seen: dict[str, object] = {"queue": [], "job": []}
    results: dict[str, object] = {}

    def through_openai() -> None:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        stream = client.chat.completions.create(**CHAT, stream=True)
        results["openai"] = "".join(c.choices[0].delta.content or "" for c in stream
                                    if c.choices)

    def through_httpx() -> None:
        with httpx.stream("POST", server.url + "/v1/chat/completions",
                          json={**CHAT, "stream": True}, timeout=120) as response:
            results["raw_status"] = response.status_code
            results["raw"] = list(response.iter_lines())

    threads = [threading.Thread(target=through_openai), threading.Thread(target=through_httpx)]
    for thread in threads:
        thread.start()
    job = httpx.post(server.url + "/api/v1/jobs",
                     json={"endpoint": "/v1/chat/completions", "body": CHAT}).json()
    deadline = time.monotonic() + 120
    cancelled = None
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        seen["queue"].extend(httpx.get(server.url + "/api/v1/queue").json()["waiting"])
        if cancelled is None:
            seen["job"].append(httpx.get(f"{server.url}/api/v1/jobs/{job['id']}").json())
            if seen["job"][-1]["queue_position"] is not None:  # seen waiting: cancel it
                cancelled = httpx.delete(f"{server.url}/api/v1/jobs/{job['id']}").json()
        time.sleep(0.2)
    for thread in threads:
        thread.join(5)
    watcher.terminate()
    watcher.wait(10)

    stages = [e["stage"] for e in events(server, "load_progress", since) if e["model"] == "smol"]
    assert stages[0] == "leasing" and stages[-1] == "ready", stages
    assert "starting" in stages and "loading" in stages
    assert stages == sorted(stages, key=STAGES.index)  # forward only, each once
    assert len(stages) == len(set(stages))

    assert results["openai"].strip()  # the comment lines did not disturb the client's parser
    raw = results["raw"]
    assert results["raw_status"] == 200
    comments = [line for line in raw if line.startswith(":")]
    assert comments and comments[0].startswith(": loading smol stage="), raw[:5]
    data = [line for line in raw if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]" and '"choices"' in data[0]
    assert raw.index(comments[-1]) < raw.index(data[0])  # comments only before the answer

    waiting = [row for row in seen["queue"] if row["model"] == "smol"]
    assert waiting and all(row["position"] >= 1 and row["waited_s"] >= 0 for row in waiting)
    assert {row["endpoint"] for row in waiting} == {"/v1/chat/completions"}
    watched = watch_log.read_text()
    assert "LOADING smol stage=" in watched and "smol" in watched.split("LOADING")[0], watched
    placed = [s for s in seen["job"] if s["queue_position"] is not None]
    assert placed and placed[0]["estimated_start"], seen["job"][:3]
    assert cancelled["status"] == "cancelled" and cancelled["queue_position"] is None
    # the job that gave up was one of three waiters: the load went on for the other two
    assert not events(server, "load_cancelled", since)


def test_a_load_its_only_client_leaves_is_cancelled(server):
    since = last_seq(server)
    before = server.worker_pids()  # smol's worker, if it is still up
    with httpx.stream("POST", server.url + "/v1/chat/completions",
                      json={**CHAT, "model": "slow-start", "stream": True},
                      timeout=120) as response:
        lines = response.iter_lines()  # kept: a dropped iterator closes the connection
        first = next(lines)  # the first comment: the load is under way
        assert first.startswith(": loading slow-start stage="), first
        workers = wait_for(lambda: len(new := server.worker_pids() - before) >= 2 and new,
                           timeout=30)  # the shell and its child
        assert not events(server, "load_cancelled", since)  # while its client waits
    # the client has gone: nobody else waits, so the load is cancelled
    wait_for(lambda: events(server, "load_cancelled", since), timeout=30)
    wait_for(lambda: not (server.worker_pids() & workers), timeout=30)  # no orphan
    status = server.status()
    slot = next(s for s in status["slots"] if s["model"] == "slow-start")
    assert slot["state"] == "idle" and slot["lease"] is None
    assert not [x for x in status["leases"] if x.get("note") == "slow-start"]
    stages = [e["stage"] for e in events(server, "load_progress", since)]
    assert stages == ["leasing", "starting", "failed"], stages
