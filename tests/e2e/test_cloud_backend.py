"""The cloud backend: a real model-boss in front of real fake-upstream processes
(``tests/fake_upstream.py``), called with the official ``openai`` client."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.conftest import ServerProcess, free_port, llama_manifest, wait_for
from tests.lazy_modules import lazy

openai = lazy("openai")

pytestmark = pytest.mark.slow

KEY = "sekrit"
UNSET_KEY_ENV = "MODEL_BOSS_TEST_NEVER_SET_KEY"
CHAT = [{"role": "user", "content": "ping"}]


def start_upstream(*flags: str) -> tuple[subprocess.Popen, int]:
    """A fake OpenAI-compatible remote on a free port, answering once it is up."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.fake_upstream", "--port", str(port),
                             *flags])

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"fake upstream {flags} exited with {proc.returncode}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1,
                             headers={"authorization": f"Bearer {KEY}"}).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout=20)
    except BaseException:
        proc.kill()
        proc.wait(5)
        raise
    return proc, port


def cloud(model_id: str, port: int, **extra: str) -> dict[str, str]:
    """A cloud manifest pointing at the fake upstream on ``port``."""
    return {"id": model_id, "backend": "cloud", "category": "llm",
            "base_url": f"http://127.0.0.1:{port}/v1", "api_key_env": "FAKE_UPSTREAM_KEY",
            "remote_model": "remote-x", **extra}


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, int]]:
    """Ports of: a healthy remote, one answering 500, a slow streamer, a mid-stream crasher."""
    started: dict[str, tuple[subprocess.Popen, int]] = {}
    flags = {"good": ("--require-key", KEY, "--chunks", "6"),
             "failing": ("--fail-status", "500"),
             "slow": ("--require-key", KEY, "--chunks", "3", "--chunk-delay-ms", "300"),
             "breaking": ("--require-key", KEY, "--chunks", "6", "--break-after", "2")}
    try:
        for name, args in flags.items():
            started[name] = start_upstream(*args)
        yield {name: port for name, (_, port) in started.items()}
    finally:
        for proc, _ in started.values():
            proc.terminate()
            proc.wait(10)


@pytest.fixture(scope="module")
def server(upstreams: dict[str, int], demo_gguf: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One model-boss serving every cloud manifest below, with FAKE_UPSTREAM_KEY set."""
    workdir = tmp_path_factory.mktemp("cloud")
    tasks = workdir / "tasks.yaml"
    tasks.write_text("tasks:\n"
                     "  ladder:\n    candidates: [ghost, 'claude:test']\n"
                     "  cloud-first:\n    candidates: ['claude:test', smol]\n")
    manifests = [
        cloud("claude:test", upstreams["good"]),
        cloud("claude:broken", upstreams["failing"]),
        cloud("claude:nowhere", free_port()),
        cloud("claude:wrong-key", upstreams["good"], api_key_env="OTHER_KEY"),
        cloud("claude:no-key", upstreams["good"], api_key_env=UNSET_KEY_ENV),
        cloud("claude:slow", upstreams["slow"]),
        cloud("claude:breaks", upstreams["breaking"]),
        {"id": "ghost", "backend": "llama-server", "path": "/nonexistent.gguf"},
        llama_manifest("smol", demo_gguf),
    ]
    process = ServerProcess(workdir, {"tasks_file": str(tasks),
                                      "gpus": [{"index": 0, "name": "sim-8g",
                                                "vram_mb": 8192}]},
                            manifests, env={"FAKE_UPSTREAM_KEY": KEY, "OTHER_KEY": "wrong"})
    process.env.pop(UNSET_KEY_ENV, None)
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def test_answer_comes_back_from_the_remote_model(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(model="claude:test", messages=CHAT)
    reply = raw.parse()
    assert reply.choices[0].message.content == "echo: ping"
    assert reply.model == "remote-x"  # the manifest's remote_model was sent upstream
    assert raw.headers["x-model-boss-model"] == "claude:test"


def test_stream_yields_the_chunks_in_order(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model="claude:test", stream=True, messages=CHAT)
    parts = [chunk.choices[0].delta.content for chunk in stream]
    assert parts == [f"part{i} " for i in range(6)]


def test_stream_is_relayed_as_it_comes_not_buffered(server: ServerProcess) -> None:
    body = {"model": "claude:slow", "stream": True, "messages": CHAT}
    arrivals: list[float] = []
    with httpx.Client(timeout=30) as http:
        http.post(server.url + "/v1/chat/completions",
                  json={**body, "stream": False}).raise_for_status()  # started and warm
        started = time.perf_counter()
        with http.stream("POST", server.url + "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: "):
                    arrivals.append(time.perf_counter() - started)
    assert len(arrivals) == 4  # three chunks, 300 ms apart, and [DONE]
    assert arrivals[0] < arrivals[-1] - 0.4, arrivals  # the first came long before the last


def test_upstream_5xx_becomes_502_in_our_envelope(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="claude:broken", messages=CHAT)
    assert caught.value.status_code == 502
    assert "upstream exploded" in caught.value.message
    assert caught.value.body["type"] == "server_error"


def test_unreachable_remote_is_502_upstream_unreachable(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="claude:nowhere", messages=CHAT)
    assert caught.value.status_code == 502
    assert caught.value.body["code"] == "upstream_unreachable"


def test_upstream_401_keeps_its_status(client: openai.OpenAI) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        client.chat.completions.create(model="claude:wrong-key", messages=CHAT)
    assert caught.value.status_code == 401
    assert "Incorrect API key" in caught.value.message


def test_unset_key_variable_warns_and_calls_without_a_key(server: ServerProcess,
                                                          client: openai.OpenAI) -> None:
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="claude:no-key", messages=CHAT)
    wait_for(lambda: f"api_key_env {UNSET_KEY_ENV} is not set" in server.log(), timeout=5)


def test_remote_dropping_mid_stream_ends_with_an_sse_error(server: ServerProcess) -> None:
    body = {"model": "claude:breaks", "stream": True, "messages": CHAT}
    with httpx.Client(timeout=30) as http, \
            http.stream("POST", server.url + "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    contents = [orjson.loads(e)["choices"][0]["delta"]["content"] for e in events[:2]]
    assert contents == ["part0 ", "part1 "]
    assert orjson.loads(events[-2])["error"]["code"] == "upstream_unreachable"


def test_a_chat_job_on_a_remote_counts_its_tokens_and_answers_whole(
        server: ServerProcess) -> None:
    """The job asks the remote for a stream (3 chunks, 300 ms apart), counts them as they
    come, and keeps the whole answer they add up to."""
    job = httpx.post(server.url + "/api/v1/jobs", json={
        "endpoint": "/v1/chat/completions",
        "body": {"model": "claude:slow", "messages": CHAT}}).json()
    url = f"{server.url}/api/v1/jobs/{job['id']}"
    wait_for(lambda: (lambda seen: seen["status"] == "running" and seen["progress"].get(
        "tokens", 0) >= 1)(httpx.get(url).json()), timeout=10)
    done = wait_for(lambda: (lambda seen: seen if seen["status"] == "succeeded" else None)(
        httpx.get(url).json()), timeout=10)
    result = done["result"]
    assert result["object"] == "chat.completion" and result["model"] == "remote-x"
    assert result["choices"][0]["message"] == {"role": "assistant",
                                               "content": "part0 part1 part2 "}
    assert result["usage"]["completion_tokens"] == 3 and done["progress"] == {"tokens": 3}


def test_cloud_models_hold_no_vram_lease(server: ServerProcess, client: openai.OpenAI) -> None:
    client.chat.completions.create(model="claude:test", messages=CHAT)
    status = server.status()
    assert status["gpus"][0]["leased_mb"] == 0
    assert status["leases"] == []


def test_cloud_fallback_guard(server: ServerProcess) -> None:
    body = {"model": "task:ladder", "messages": CHAT}
    chat = server.url + "/v1/chat/completions"
    assert httpx.post(chat, json=body, timeout=30).headers[
        "x-model-boss-model"] == "claude:test"  # the ghost cannot load: cloud fallback
    httpx.put(server.url + "/api/v1/config", json={"allowCloudFallback": False}).raise_for_status()
    try:
        assert httpx.post(chat, json=body, timeout=30).status_code == 503  # only the ghost
        first = httpx.post(chat, json={**body, "model": "task:cloud-first"}, timeout=30)
        assert first.headers["x-model-boss-model"] == "claude:test"  # position 0 is kept
        assert httpx.post(chat, json={**body, "model": "claude:test"},
                          timeout=30).status_code == 200
    finally:
        httpx.put(server.url + "/api/v1/config", json={"allowCloudFallback": True})
