"""The ``command`` backend with a real small worker process: speech, load failures."""

from __future__ import annotations

import io
import sys
import wave

import httpx
import openai
import pytest

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
