"""The ``command`` backend with a real small worker process: speech, load failures."""

from __future__ import annotations

import base64
import io
import sys
import time
import wave

import httpx
import pytest

from tests.conftest import pid_alive, wait_for
from tests.lazy_modules import lazy

openai = lazy("openai")

pytestmark = pytest.mark.slow


def tts(model_id: str, *flags: str) -> dict:
    return {"id": model_id, "category": "tts", "backend": "command", "vram_mb": 500,
            "command": [sys.executable, "-m", "tests.workers.tiny_tts", "--port", "{port}",
                        *flags]}


def test_speech_through_a_command_worker(make_server):
    server = make_server({"health_timeout_s": 3},
                         [tts("tiny-tts"), tts("broken-tts", "--exit-on-start"),
                          tts("slow-tts", "--start-delay", "30")])
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    audio = client.audio.speech.create(model="tiny-tts", voice="alloy", input="hello there")
    with wave.open(io.BytesIO(audio.content)) as wav:
        assert wav.getnframes() == int(0.05 * len("hello there") * 16000)
    job = httpx.post(server.url + "/api/v1/jobs", json={
        "endpoint": "/v1/audio/speech", "body": {"model": "tiny-tts", "input": "hi"}}).json()
    assert job["status"] in ("queued", "loading")

    def finished() -> dict | None:
        now = httpx.get(f"{server.url}/api/v1/jobs/{job['id']}").json()
        return None if now["status"] in ("queued", "loading", "running") else now

    done = wait_for(finished, timeout=30)
    assert done["status"] == "succeeded" and done["model"] == "tiny-tts", done
    assert done["result"]["content_type"] == "audio/wav", done
    with wave.open(io.BytesIO(base64.b64decode(done["result"]["b64"]))) as wav:
        assert wav.getnframes() == int(0.05 * len("hi") * 16000)  # the job's own input

    broken = httpx.post(server.url + "/v1/audio/speech",
                        json={"model": "broken-tts", "input": "x"}, timeout=30)
    assert broken.status_code == 503
    error = broken.json()["error"]
    assert error["code"] == "model_load_failed" and "refusing to start" in error["message"]

    slow = httpx.post(server.url + "/v1/audio/speech",
                      json={"model": "slow-tts", "input": "x"}, timeout=30)
    assert slow.status_code == 503 and "did not become healthy" in slow.json()["error"][
        "message"]
    status = server.status()
    assert {s["model"]: s["state"] for s in status["slots"]}["slow-tts"] == "idle"
    assert status["gpus"][0]["leased_mb"] == 500  # only tiny-tts holds a lease
    assert len(server.worker_pids()) == 1

    bad = httpx.post(server.url + "/v1/audio/speech", json={"model": "tiny-tts"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"


def test_worker_ignoring_sigterm_is_killed_after_the_grace(make_server):
    server = make_server({"stop_grace_s": 1}, [tts("stubborn", "--ignore-sigterm")])
    assert httpx.post(server.url + "/v1/audio/speech", timeout=30,
                      json={"model": "stubborn", "input": "x"}).status_code == 200
    pid = next(s for s in server.status()["slots"])["pid"]
    started = time.monotonic()
    assert httpx.post(server.url + "/api/v1/models/stubborn/unload", timeout=30).json()[
        "unloaded"]
    assert 0.9 < time.monotonic() - started < 5
    assert not pid_alive(pid)


def test_preload_loads_in_the_background_and_survives_a_failure(make_server):
    server = make_server({"preload": ["slow-tts", "broken-tts"], "health_timeout_s": 10},
                         [tts("slow-tts", "--start-delay", "2"),
                          tts("broken-tts", "--exit-on-start")])
    # the server answers while the preload is still starting its worker
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/v1/models").status_code == 200
    wait_for(lambda: {s["model"]: s["state"] for s in server.status()["slots"]}.get(
        "slow-tts") == "ready", timeout=30)
    events = httpx.get(server.url + "/api/v1/events?stream=false").json()["events"]
    failed = [e for e in events if e["type"] == "preload_failed"]
    assert [e["model"] for e in failed] == ["broken-tts"]
    assert any(e["type"] == "preloaded" and e["model"] == "slow-tts" for e in events)


def test_unknown_preload_model_is_a_config_error(make_server):
    server = make_server({"preload": ["nope"]}, [tts("tiny-tts")], start=False)
    with pytest.raises(RuntimeError, match="preload.0: unknown model 'nope'"):
        server.start(timeout=20)
