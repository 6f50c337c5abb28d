"""SIGKILL of a real llama.cpp worker in the middle of a stream, over and over.

Each time: the stream ends with an SSE error event and ``[DONE]`` (never a broken connection),
the lease is gone, and the very next request succeeds on a fresh worker — never on the dead
one, even when it arrives before the exit watcher has run.
"""

from __future__ import annotations

import json
import os
import signal

import httpx
import pytest

from tests.conftest import llama_manifest, pid_alive

pytestmark = pytest.mark.slow

KILLS = int(os.environ.get("MODEL_BOSS_KILLS", "10"))  # more: set it


def test_kill_mid_stream_then_next_request_succeeds(make_server, demo_gguf):
    server = make_server({"gpus": [{"index": 0, "name": "sim-8g", "vram_mb": 8192}]},
                         [llama_manifest("smol", demo_gguf, vram_mb=1000)])
    stream_body = {"model": "smol", "stream": True, "max_tokens": 400, "ignore_eos": True,
                   "messages": [{"role": "user", "content": "Write a very long story."}]}
    chat = {"model": "smol", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    recovered = 0
    pids: set[int] = set()
    with httpx.Client(base_url=server.url, timeout=120) as client:
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
        for _ in range(KILLS):
            events: list[str] = []
            killed = None
            with client.stream("POST", "/v1/chat/completions", json=stream_body) as response:
                assert response.status_code == 200
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                    if len(events) == 2 and killed is None:
                        killed = _pid_of(server)
                        os.kill(killed, signal.SIGKILL)
            assert killed is not None and events[-1] == "[DONE]", events[-3:]
            error = json.loads(events[-2])["error"]
            assert error["code"] == "worker_failed", error
            assert "Traceback" not in error["message"] and "/" not in error["message"]
            # the next request comes at once, possibly before the exit watcher ran
            reply = client.post("/v1/chat/completions", json=chat)
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["message"]["content"] is not None
            assert not pid_alive(killed)
            pids.add(killed)
            recovered += 1
    assert recovered == KILLS and len(pids) == KILLS
    status = server.status()
    assert len(status["leases"]) == 1 and status["slots"][0]["state"] == "ready"
    assert len(server.worker_pids()) == 1


def _pid_of(server) -> int:
    slot = next(s for s in server.status()["slots"] if s["model"] == "smol")
    assert slot["state"] == "ready" and slot["pid"], slot
    return slot["pid"]
