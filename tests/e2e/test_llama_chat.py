"""The real request path: the official openai client → model-boss → llama.cpp on SmolLM2."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess, llama_manifest, pid_alive, wait_for
from tests.lazy_modules import lazy

openai = lazy("openai")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf):
    missing = {"id": "ghost", "backend": "llama-server", "path": "/nonexistent/ghost.gguf"}
    srv = ServerProcess(tmp_path_factory.mktemp("chat"),
                        {"gpus": [{"index": 0, "name": "sim-8g", "vram_mb": 8192}]},
                        [llama_manifest("smol", demo_gguf, aliases=["demo", "smollm2-135m"]),
                         missing])
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_the_readmes_first_example_runs_as_written(server, capsys):
    """The README's six-line OpenAI example, its address pointed at this server."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    example = readme.split("```python\n")[1].split("```")[0]
    assert len(example.splitlines()) == 6, example
    exec(compile(example.replace("http://127.0.0.1:8210", server.url), "README.md", "exec"), {})
    assert capsys.readouterr().out.strip()


def test_chat_returns_text(client, server):
    reply = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "Say hello."}], max_tokens=16)
    assert reply.choices[0].message.content.strip()
    assert reply.model == "smol"
    slot = server.status()["slots"][0]
    assert slot["state"] == "ready" and slot["loads"] >= 1 and slot["last_load_s"] > 0


def test_stream_yields_chunks_in_order(client):
    """The streamed pieces, joined in the order they came, are the answer the same greedy
    request gets whole: one chunk out of place (or lost, or repeated) would differ."""
    ask = {"model": "smol", "max_tokens": 32, "temperature": 0, "seed": 7,
           "messages": [{"role": "user", "content": "Count from one to ten."}],
           "extra_body": {"ignore_eos": True}}  # always 32 tokens
    whole = client.chat.completions.create(**ask).choices[0].message.content
    chunks = list(client.chat.completions.create(**ask, stream=True))
    choices = [c.choices[0] for c in chunks if c.choices]
    pieces = [c.delta.content for c in choices if c.delta.content]
    assert len(pieces) >= 16
    assert "".join(pieces) == whole and whole.strip()
    assert choices[0].delta.role == "assistant"
    # only the last says why it ended, and every chunk belongs to the one answer
    assert [c.finish_reason for c in choices] == [None] * (len(choices) - 1) + ["length"]
    assert len({c.id for c in chunks}) == 1


def test_the_fingerprint_is_the_llama_cpp_build_not_b0_unknown(client):
    """The xllamacpp wheel's server says ``b0-unknown``: answers carry the wheel's build."""
    import importlib.metadata

    build = "xllamacpp-" + importlib.metadata.version("xllamacpp")
    ask = {"model": "smol", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi."}]}
    assert client.chat.completions.create(**ask).system_fingerprint == build
    assert {c.system_fingerprint for c in client.chat.completions.create(**ask, stream=True)} \
        == {build}
    assert client.completions.create(model="smol", prompt="Hi", max_tokens=4) \
        .system_fingerprint == build


def test_stream_is_not_buffered(server):
    """Chunks arrive as the worker makes them: the first well before the last."""
    body = {"model": "smol", "stream": True, "max_tokens": 64, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Write a long story about a cat."}]}
    arrivals = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                      timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                arrivals.append(time.monotonic())
    assert len(arrivals) > 10
    assert arrivals[-1] - arrivals[0] > 0.05


def test_text_completion(client):
    reply = client.completions.create(model="smol", prompt="The capital of France is",
                                      max_tokens=8)
    assert reply.choices[0].text


def test_models_lists_catalog_with_availability(client, server):
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {"smol", "ghost"}
    listed = httpx.get(server.url + "/v1/models").json()["data"]
    ghost = next(m for m in listed if m["id"] == "ghost")
    assert ghost["available"] is False and "not found" in ghost["unavailable_reason"]


def test_unknown_model_is_404_envelope(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model",
                                       messages=[{"role": "user", "content": "x"}])
    error = caught.value.body
    assert caught.value.status_code == 404
    assert error["code"] == "model_not_found" and error["param"] == "model"


def test_missing_model_file_is_503_with_reason(client):
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="ghost",
                                       messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 503
    assert "model file not found" in caught.value.body["message"]


@pytest.mark.parametrize("payload, param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(), "model"),
    (json.dumps({"model": "smol"}).encode(), "messages"),
    (json.dumps({"model": "smol", "messages": []}).encode(), "messages"),
    (json.dumps({"model": "smol", "messages": [{"role": "user", "content": "x"}],
                 "x_priority": "urgent"}).encode(), "x_priority"),
    (json.dumps({"model": "smol", "messages": [{"role": "user", "content": "x"}],
                 "max_tokens": -3}).encode(), "max_tokens"),
])
def test_malformed_bodies_are_400_envelopes(server, payload, param):
    response = httpx.post(server.url + "/v1/chat/completions", content=payload,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param


def test_oversized_body_is_413(server):
    big = {"model": "smol", "messages": [{"role": "user", "content": "x" * (9 * 2**20)}]}
    response = httpx.post(server.url + "/v1/chat/completions", json=big, timeout=30)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"


def test_x_fields_are_stripped_and_headers_accepted(server):
    body = {"model": "smol", "max_tokens": 4, "x_client_id": "alice", "x_priority": 1,
            "x_anything_else": {"deep": True},
            "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(server.url + "/v1/chat/completions", json=body,
                          headers={"X-Client-Id": "ignored-because-body-wins"}, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["x-model-boss-model"] == "smol"
    clients = {c["client_id"]: c for c in server.status()["queue"]["clients"]}
    assert clients["alice"]["succeeded"] >= 1
    response = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                          json={"model": "smol", "max_tokens": 4,
                                "messages": [{"role": "user", "content": "hi"}]},
                          headers={"X-Client-Id": "bob", "X-Priority": "2"})
    assert response.status_code == 200
    assert "bob" in {c["client_id"] for c in server.status()["queue"]["clients"]}


def _ready_pid(server) -> int:
    """Load the model if it is not loaded, and return its worker's pid."""
    warm = {"model": "smol", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(server.url + "/v1/chat/completions", json=warm, timeout=60).is_success
    slot = wait_for(lambda: next((s for s in server.status()["slots"]
                                  if s["model"] == "smol" and s["state"] == "ready"), None),
                    timeout=60)
    return slot["pid"]


def test_worker_killed_while_idle_is_reloaded(client, server):
    client.chat.completions.create(model="smol", max_tokens=2,
                                   messages=[{"role": "user", "content": "hi"}])
    pid = _ready_pid(server)
    loads = server.status()["slots"][0]["loads"]
    os.kill(pid, signal.SIGKILL)
    slot = wait_for(lambda: next((s for s in server.status()["slots"]
                                  if s["model"] == "smol" and s["state"] == "idle"), None),
                    timeout=10)
    assert "stopped unexpectedly (killed by signal 9 (SIGKILL))" in slot["last_error"]
    assert server.status()["gpus"][0]["leased_mb"] == 0
    reply = client.chat.completions.create(model="smol", max_tokens=4,
                                           messages=[{"role": "user", "content": "hello"}])
    assert reply.choices[0].message.content
    slot = server.status()["slots"][0]
    assert slot["loads"] == loads + 1 and slot["pid"] != pid


def test_worker_killed_during_stream_gives_error_event(server):
    pid = _ready_pid(server)
    body = {"model": "smol", "stream": True, "max_tokens": 400, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Write a very long story."}]}
    events = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                      timeout=60) as response:
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if len(events) == 3:
                threading.Thread(target=os.kill, args=(pid, signal.SIGKILL)).start()
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "worker_failed" and error["type"] == "server_error"
    # in the user's words: what ended and what to do; no class names, no worker log lines
    assert error["message"] == ("The worker of 'smol' stopped unexpectedly (killed by signal 9 "
                                "(SIGKILL)). Retry the request: the next one loads the model "
                                "again.")
    assert not pid_alive(pid)
    wait_for(lambda: server.status()["gpus"][0]["leased_mb"] == 0, timeout=10)
    events = httpx.get(server.url + "/api/v1/events?stream=false").json()["events"]
    assert any(e["type"] == "worker_crashed" and e["model"] == "smol" for e in events)


def test_status_shape(server):
    status = server.status()
    gpu = status["gpus"][0]
    assert gpu["capacity_mb"] == 8192 and gpu["source"] == "declared"
    assert gpu["free_mb"] == gpu["capacity_mb"] - gpu["leased_mb"] - 512
    for key in ("state", "pid", "port", "vram_estimate", "last_used", "unload_at",
                "active_requests", "last_load_s"):
        assert key in status["slots"][0]
    assert status["queue"]["depth"] == 0
    assert isinstance(status["leases"], list)
    metrics = httpx.get(server.url + "/metrics").text
    assert "model_boss_requests_total" in metrics


def test_client_that_disconnects_leaves_the_queue(server):
    """A queued request whose client goes away is dropped, not served later."""
    warm = {"model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(server.url + "/v1/chat/completions", json=warm, timeout=60).is_success
    # busy until this test lets go: a story the model may end early would free the slot
    # and serve the queued request within its second
    busy = {"model": "smol", "stream": True, "max_tokens": 4000, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Write a long story."}]}
    queued = {"model": "smol", "max_tokens": 4, "x_client_id": "impatient",
              "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=busy,
                      timeout=60) as response:
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data: "))  # the slot is now busy
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/v1/chat/completions", json=queued, timeout=1.0)
        wait_for(lambda: server.status()["queue"]["depth"] == 0, timeout=5)
    # the stream's client went too: its slot is free again
    wait_for(lambda: next(s for s in server.status()["slots"]
                          if s["model"] == "smol")["active_requests"] == 0, timeout=10)
    events = httpx.get(server.url + "/api/v1/events?stream=false").json()["events"]
    assert any(e["type"] == "request_cancelled" and e["client"] == "impatient"
               for e in events)
    impatient = next(c for c in server.status()["queue"]["clients"]
                     if c["client_id"] == "impatient")
    assert impatient["succeeded"] == 0 and impatient["in_flight"] == 0


def poll_job(server, job_id, until=("succeeded", "failed", "cancelled"), timeout=60):
    return wait_for(lambda: (lambda j: j if j["status"] in until else None)(
        httpx.get(f"{server.url}/api/v1/jobs/{job_id}").json()), timeout=timeout)


def shape(value):
    """A JSON value's keys, all the way down (a list: its first item's)."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def test_chat_job_submit_poll_list(server):
    body = {"model": "smol", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "hi"}]}
    submitted = httpx.post(server.url + "/api/v1/jobs", json={
        "endpoint": "/v1/chat/completions", "body": {**body, "x_client_id": "jobber"}})
    assert submitted.status_code == 202
    job = submitted.json()
    assert job["status"] in ("queued", "loading") and job["id"].startswith("job-")
    done = poll_job(server, job["id"])
    assert done["status"] == "succeeded", done
    assert done["result"]["choices"][0]["message"]["content"]
    assert done["model"] == "smol" and done["timings"]["total_s"] > 0
    # the whole answer a live request without a stream gets (its tokens counted meanwhile)
    live = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    assert shape(done["result"]) == shape(live)
    assert done["result"]["choices"] == live["choices"]
    assert 1 <= done["progress"]["tokens"] <= live["usage"]["completion_tokens"]
    listed = httpx.get(server.url + "/api/v1/jobs?client_id=jobber").json()["jobs"]
    assert [j["id"] for j in listed] == [job["id"]]
    assert httpx.get(server.url + "/api/v1/jobs?client_id=nobody").json()["jobs"] == []


def test_job_cancel_and_errors(server):
    long = httpx.post(server.url + "/api/v1/jobs", json={
        "endpoint": "/v1/completions",
        # a story the model may end early would finish the job before it is cancelled
        "body": {"model": "smol", "max_tokens": 1500, "prompt": "Once upon a time",
                 "ignore_eos": True}}).json()
    poll_job(server, long["id"], until=("running",), timeout=60)

    def job() -> dict:
        return httpx.get(f"{server.url}/api/v1/jobs/{long['id']}").json()

    # its progress: the tokens generated so far, growing while it runs
    first = wait_for(lambda: job()["progress"].get("tokens"), timeout=30, what=job)
    wait_for(lambda: job()["progress"]["tokens"] > first, timeout=30, what=job)
    cancelled = httpx.delete(f"{server.url}/api/v1/jobs/{long['id']}").json()
    assert cancelled["status"] == "cancelled"
    wait_for(lambda: all(s["active_requests"] == 0 for s in server.status()["slots"]),
             timeout=10)
    bad = httpx.post(server.url + "/api/v1/jobs", json={"endpoint": "/v1/nope", "body": {}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "endpoint"
    bad = httpx.post(server.url + "/api/v1/jobs", json={
        "endpoint": "/v1/chat/completions", "body": {"model": "smol"}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
    # refused at once, as the live request would be: an unknown model, a stream
    unknown = httpx.post(server.url + "/api/v1/jobs", json={
        "endpoint": "/v1/chat/completions",
        "body": {"model": "nope", "messages": [{"role": "user", "content": "x"}]}})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    streamed = httpx.post(server.url + "/api/v1/jobs", json={
        "endpoint": "/v1/chat/completions",
        "body": {"model": "smol", "stream": True, "messages": [{"role": "user", "content": "x"}]}})
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "stream"
    # a known model that cannot load now (its file is missing) fails as the job runs
    failed = httpx.post(server.url + "/api/v1/jobs", json={
        "endpoint": "/v1/chat/completions",
        "body": {"model": "ghost", "messages": [{"role": "user", "content": "x"}]}}).json()
    failed = poll_job(server, failed["id"])
    assert failed["status"] == "failed" and failed["error"]["code"] == "model_unavailable"
    missing = httpx.get(server.url + "/api/v1/jobs/job-doesnotexist")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "job_not_found"


def test_events_stream_and_cli(server):
    """The SSE event feed delivers live events; ``model-boss ps`` reads the status."""
    import subprocess
    import sys

    httpx.post(server.url + "/api/v1/models/smol/unload", timeout=30)
    seen = []
    with httpx.stream("GET", server.url + "/api/v1/events", timeout=60) as feed:
        lines = feed.iter_lines()
        httpx.post(server.url + "/api/v1/models/smol/load", timeout=60)
        for line in lines:
            if line.startswith("data: "):
                event = json.loads(line[6:])
                seen.append(event["type"])
                if event["type"] == "loaded":
                    break
    assert "load_started" in seen and seen[-1] == "loaded"
    ps = subprocess.run([sys.executable, "-m", "model_boss", "--url", server.url, "ps"],
                        capture_output=True, text=True, timeout=30)
    assert ps.returncode == 0 and "smol" in ps.stdout and "ready" in ps.stdout
    assert "sim-8g" in ps.stdout


def test_stream_client_that_goes_away_frees_the_slot(server):
    body = {"model": "smol", "stream": True, "max_tokens": 2000, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Write a very long story."}]}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                      timeout=60) as response:
        lines = response.iter_lines()
        for _ in range(3):
            next(line for line in lines if line.startswith("data: "))
        busy = next(s for s in server.status()["slots"] if s["model"] == "smol")
        assert busy["active_requests"] == 1
    started = time.monotonic()
    wait_for(lambda: next(s for s in server.status()["slots"]
                          if s["model"] == "smol")["active_requests"] == 0, timeout=10)
    assert time.monotonic() - started < 5  # far sooner than 2000 tokens would take
    reply = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 200
