"""No worker outlives the coordinator: SIGTERM, SIGKILL, and the next start."""

from __future__ import annotations

import json
import signal

import httpx
import pytest

from tests.conftest import ServerProcess, llama_manifest, pid_alive, wait_for

pytestmark = pytest.mark.slow


def load_worker(server) -> int:
    response = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 200
    return server.status()["slots"][0]["pid"]


def test_sigterm_stops_every_worker_and_releases_leases(make_server, demo_gguf):
    server = make_server({}, [llama_manifest("smol", demo_gguf)])
    pid = load_worker(server)
    assert pid_alive(pid)
    # uvicorn re-raises the signal after its graceful shutdown, so the exit status is -15
    assert server.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    assert not pid_alive(pid)
    log = server.log()
    assert "Application shutdown complete" in log
    assert "released" in log and "slot_state" in log


def test_sigkill_of_coordinator_leaves_no_orphan(tmp_path, demo_gguf):
    server = ServerProcess(tmp_path, {}, [llama_manifest("smol", demo_gguf)]).start()
    pid = load_worker(server)
    pid_file = tmp_path / "state" / "workers" / f"{pid}.json"
    record = json.loads(pid_file.read_text())
    assert record["pid"] == record["pgid"] == pid  # the worker's own process group
    server.stop(signal.SIGKILL)
    # The worker notices its parent is gone (PR_SET_PDEATHSIG) ...
    wait_for(lambda: not pid_alive(pid), timeout=10)
    # ... and the next start clears what the last run left behind.
    again = ServerProcess(tmp_path, {}, [llama_manifest("smol", demo_gguf)])
    again.start()
    try:
        assert not pid_file.exists()
        assert again.status()["slots"] == []
        assert again.worker_pids() == set()
    finally:
        again.stop()
