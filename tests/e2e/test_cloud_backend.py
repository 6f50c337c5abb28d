"""The cloud backend against a local OpenAI-compatible server started by the test."""

from __future__ import annotations

import subprocess
import sys

import httpx
import openai
import pytest

from tests.conftest import free_port, llama_manifest, wait_for

pytestmark = pytest.mark.slow


def start_upstream(*flags: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.fake_upstream", "--port", str(port),
                             *flags])

    def up() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/v1/models",
                             headers={"authorization": "Bearer sekrit"}).status_code < 500
        except httpx.HTTPError:
            return False

    wait_for(up, timeout=20)
    return proc, port


@pytest.fixture(scope="module")
def upstreams():
    good, good_port = start_upstream("--require-key", "sekrit", "--chunks", "6")
    bad, bad_port = start_upstream("--fail-status", "500")
    yield good_port, bad_port
    for proc in (good, bad):
        proc.terminate()
        proc.wait(10)


def cloud(model_id: str, port: int, **extra) -> dict:
    return {"id": model_id, "backend": "cloud", "category": "llm",
            "base_url": f"http://127.0.0.1:{port}/v1", "api_key_env": "FAKE_UPSTREAM_KEY",
            "remote_model": "remote-x", **extra}


def test_cloud_models(make_server, upstreams, demo_gguf, tmp_path):
    good, bad = upstreams
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text("tasks:\n"
                     "  ladder:\n    candidates: [ghost, 'claude:test']\n"
                     "  cloud-first:\n    candidates: ['claude:test', smol]\n")
    server = make_server(
        {"tasks_file": str(tasks)},
        [cloud("claude:test", good), cloud("claude:broken", bad),
         cloud("claude:nowhere", free_port()), cloud("claude:wrong-key", good,
                                                     api_key_env="OTHER_KEY"),
         {"id": "ghost", "backend": "llama-server", "path": "/nonexistent.gguf"},
         llama_manifest("smol", demo_gguf)],
        env={"FAKE_UPSTREAM_KEY": "sekrit", "OTHER_KEY": "wrong"})
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    reply = client.chat.completions.create(
        model="claude:test", messages=[{"role": "user", "content": "ping"}])
    assert reply.choices[0].message.content == "echo: ping" and reply.model == "remote-x"
    stream = client.chat.completions.create(
        model="claude:test", stream=True, messages=[{"role": "user", "content": "ping"}])
    parts = [c.choices[0].delta.content for c in stream]
    assert parts == [f"part{i} " for i in range(6)]
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="claude:broken",
                                       messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 502 and "upstream exploded" in caught.value.message
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="claude:nowhere",
                                       messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 502
    assert caught.value.body["code"] == "upstream_unreachable"
    with pytest.raises(openai.AuthenticationError) as caught:
        client.chat.completions.create(model="claude:wrong-key",
                                       messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 401 and "bad key" in caught.value.message
    status = server.status()
    assert status["gpus"][0]["leased_mb"] == 0 and status["leases"] == []
    # the cloud-fallback guard
    body = {"model": "task:ladder", "messages": [{"role": "user", "content": "x"}]}
    assert httpx.post(server.url + "/v1/chat/completions", json=body).headers[
        "x-model-boss-model"] == "claude:test"
    httpx.put(server.url + "/api/v1/config", json={"allowCloudFallback": False})
    stripped = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert stripped.status_code == 503  # only the missing ghost is left
    first = httpx.post(server.url + "/v1/chat/completions",
                       json={**body, "model": "task:cloud-first"})
    assert first.headers["x-model-boss-model"] == "claude:test"  # position 0 is kept
    direct = httpx.post(server.url + "/v1/chat/completions", json={**body,
                                                                  "model": "claude:test"})
    assert direct.status_code == 200
