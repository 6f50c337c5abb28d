"""A worker started through a shell leaves a grandchild in its process group: neither a
SIGKILLed coordinator nor a crashed shell may leave that grandchild (or its lease) behind."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import sys

import httpx
import psutil
import pytest

from tests.conftest import ServerProcess, pid_alive, wait_for
from tests.workers.group_probe import kill_leftovers, live_group

pytestmark = pytest.mark.slow

_PR_SET_CHILD_SUBREAPER = 36


def shell_tts(model_id: str) -> dict:
    """tiny_tts run in the background of ``sh -c``: the worker's leader is the shell."""
    worker = f"{shlex.quote(sys.executable)} -m tests.workers.tiny_tts --port {{port}}"
    return {"id": model_id, "category": "tts", "backend": "command", "vram_mb": 500,
            "command": ["sh", "-c", f"{worker} & wait"]}


def load(server: ServerProcess) -> tuple[int, int]:
    """Load the worker; its leader's pid (the shell) and the grandchild's (tiny_tts)."""
    response = httpx.post(server.url + "/v1/audio/speech", timeout=60,
                          json={"model": "tiny-tts", "input": "hi"})
    assert response.status_code == 200
    leader = server.status()["slots"][0]["pid"]
    [grandchild] = wait_for(lambda: psutil.Process(leader).children(), timeout=10)
    return leader, grandchild.pid


def leases(server: ServerProcess) -> list[dict]:
    return httpx.get(server.url + "/api/v1/leases", timeout=10).json()["leases"]


@pytest.fixture
def subreaper():
    """This test process adopts what its coordinators orphan, and reaps a pid on request: a
    dead worker leader is then gone for good, as under an init that reaps (a container's PID 1
    may not, and a zombie leader still holds its pid)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)

    def reap(pid: int) -> bool:
        with contextlib.suppress(ChildProcessError):
            return os.waitpid(pid, os.WNOHANG)[0] == pid
        return False

    try:
        yield reap
    finally:
        # the second coordinator's worker leaves its grandchild to us too when it stops
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error, ChildProcessError):
                if child.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(child.pid, os.WNOHANG)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 0)


def test_next_coordinator_reaps_a_shell_workers_grandchild(tmp_path, subreaper):
    server = ServerProcess(tmp_path, {}, [shell_tts("tiny-tts")]).start()
    leader, grandchild = load(server)
    assert len(leases(server)) == 1
    server.stop(signal.SIGKILL)
    try:
        # the parent death signal takes the shell; tiny_tts, its child, stays in the group
        wait_for(lambda: subreaper(leader), timeout=10)
        assert not psutil.pid_exists(leader)
        assert live_group(leader) == [grandchild]

        again = ServerProcess(tmp_path, {}, [shell_tts("tiny-tts")]).start()
        try:
            assert live_group(leader) == []  # reaped before the new one answers
            assert list((tmp_path / "state" / "workers").iterdir()) == []
            assert leases(again) == []
            assert again.status()["slots"] == []
            events = httpx.get(again.url + "/api/v1/events?stream=false").json()["events"]
            assert [e["pids"] for e in events if e["type"] == "orphans_reaped"] == [[grandchild]]
            load(again)  # the worker's port and model are free for the next run
            assert len(leases(again)) == 1
        finally:
            again.stop()
    finally:
        kill_leftovers(leader)
        with contextlib.suppress(AssertionError):  # no zombie of ours left behind
            wait_for(lambda: subreaper(grandchild), timeout=5)


def test_a_crashed_shell_worker_leaves_no_grandchild_and_no_lease(make_server):
    server = make_server({}, [shell_tts("tiny-tts")])
    leader, grandchild = load(server)
    try:
        os.kill(leader, signal.SIGKILL)  # the shell dies; its child would carry on serving
        wait_for(lambda: not leases(server), timeout=10)
        assert live_group(leader) == []
        assert not pid_alive(grandchild)
        assert [s["state"] for s in server.status()["slots"]] == ["idle"]
        events = httpx.get(server.url + "/api/v1/events?stream=false").json()["events"]
        assert any(e["type"] == "worker_crashed" for e in events)
    finally:
        kill_leftovers(leader)


def test_sigterm_stops_a_shell_workers_whole_group(make_server):
    server = make_server({}, [shell_tts("tiny-tts")])
    leader, grandchild = load(server)
    try:
        assert server.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
        assert live_group(leader) == []
        assert not list((server.workdir / "state" / "workers").iterdir())
    finally:
        kill_leftovers(leader)
