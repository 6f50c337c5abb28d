"""Process groups of workers: nothing a worker spawned outlives its leader or its coordinator.

Real processes throughout: ``sh -c "sleep & sleep & wait"`` leaves grandchildren in the
worker's group that neither ``PR_SET_PDEATHSIG`` nor a signal to the leader reaches.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from model_boss.backends.processes import WorkerProcess, group_members, reap_orphans
from tests.conftest import ROOT, pid_alive, wait_for
from tests.workers.group_probe import kill_leftovers, live_group

SLEEPERS = ["sh", "-c", "sleep 300 & sleep 300 & wait"]
# the same with the grandchildren's output elsewhere: they do not hold the worker's pipe open
QUIET_SLEEPERS = ["sh", "-c", "sleep 300 >/dev/null 2>&1 & sleep 300 >/dev/null 2>&1 & wait"]


def children_of(pid: int, count: int) -> list[int]:
    return wait_for(lambda: len(kids := psutil.Process(pid).children()) == count and
                    [kid.pid for kid in kids], timeout=10)


@pytest.fixture
def orphaned_group(tmp_path):
    """A worker group whose coordinator was SIGKILLed: its leader died with it (the parent
    death signal) and was reaped, its two grandchildren live on. Yields (pid dir, pgid,
    grandchildren)."""
    pid_dir = tmp_path / "workers"
    reaper = subprocess.Popen(
        [sys.executable, "-m", "tests.workers.orphan_parent", "--pid-dir", str(pid_dir),
         *SLEEPERS], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert reaper.stdout is not None
        coordinator, leader = map(int, reaper.stdout.readline().split())
        grandchildren = children_of(leader, 2)
        os.kill(coordinator, signal.SIGKILL)
        wait_for(lambda: not psutil.pid_exists(leader), timeout=10)
        yield pid_dir, leader, grandchildren
    finally:
        kill_leftovers(leader)
        reaper.kill()
        reaper.wait(10)


def test_reaper_kills_a_group_whose_leader_died_with_the_coordinator(orphaned_group):
    pid_dir, pgid, grandchildren = orphaned_group
    record = json.loads((pid_dir / f"{pgid}.json").read_text())
    assert record["pgid"] == record["pid"] == pgid
    assert sorted(live_group(pgid)) == sorted(grandchildren)  # the leader is gone, they are not
    assert not psutil.pid_exists(pgid)

    assert sorted(reap_orphans(pid_dir)) == sorted(grandchildren)
    wait_for(lambda: not live_group(pgid), timeout=10)
    assert list(pid_dir.iterdir()) == []
    assert reap_orphans(pid_dir) == []


def write_pid_file(pid_dir: Path, pgid: int, create_time: float) -> None:
    pid_dir.mkdir(exist_ok=True)
    (pid_dir / f"{pgid}.json").write_text(json.dumps(
        {"pid": pgid, "pgid": pgid, "name": "test", "create_time": create_time}))


def test_reaper_kills_a_live_leader_with_its_group(tmp_path):
    leader = subprocess.Popen(SLEEPERS, start_new_session=True)  # escaped the parent death
    try:
        grandchildren = children_of(leader.pid, 2)
        write_pid_file(tmp_path, leader.pid, psutil.Process(leader.pid).create_time())
        assert sorted(reap_orphans(tmp_path)) == sorted([leader.pid, *grandchildren])
        assert leader.wait(10) == -signal.SIGKILL
        wait_for(lambda: not live_group(leader.pid), timeout=10)
    finally:
        leader.kill()
        leader.wait(10)


def test_reaper_leaves_a_group_number_now_held_by_another_process(tmp_path):
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        # the recorded worker started long after this process: the number has been reused
        write_pid_file(tmp_path, other.pid, psutil.Process(other.pid).create_time() + 3600)
        assert reap_orphans(tmp_path) == []
        assert pid_alive(other.pid)
        assert list(tmp_path.iterdir()) == []
    finally:
        other.kill()
        other.wait(10)


def test_reaper_never_touches_our_own_group_or_session(tmp_path):
    for pgid in {os.getpgrp(), os.getpid(), os.getsid(0)}:
        try:
            created = psutil.Process(pgid).create_time()  # recorded as if it were a worker
        except psutil.NoSuchProcess:
            created = 0.0
        write_pid_file(tmp_path, pgid, created)
    (tmp_path / "broken.json").write_text("{not json")
    assert reap_orphans(tmp_path) == []
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [SLEEPERS, QUIET_SLEEPERS], ids=["holding-output", "quiet"])
async def test_a_crashed_leader_takes_its_group_along(tmp_path, argv):
    exits: list[int] = []
    exited = asyncio.Event()
    worker = WorkerProcess("crashy", argv, pid_dir=tmp_path)
    worker.on_exit = lambda code: (exits.append(code), exited.set())
    await worker.start()
    assert worker.pid is not None
    grandchildren = await asyncio.to_thread(children_of, worker.pid, 2)
    assert (tmp_path / f"{worker.pid}.json").exists()

    os.kill(worker.pid, signal.SIGKILL)  # only the leader
    await asyncio.wait_for(exited.wait(), 10)
    assert exits == [-signal.SIGKILL]
    assert live_group(worker.pid) == []
    assert not any(pid_alive(pid) for pid in grandchildren)
    assert not (tmp_path / f"{worker.pid}.json").exists()
    assert await worker.stop(1) == -signal.SIGKILL


async def start_with_child(tmp_path: Path, name: str, child: str) -> WorkerProcess:
    """A worker whose shell runs ``child`` in the background, its output not on our pipe;
    returns once ``child`` has got past its first line (its trap is set)."""
    ready = tmp_path / f"{name}-ready"
    worker = WorkerProcess(name, ["sh", "-c", f"sh -c \"{child}; touch {ready}; sleep 300 "
                                  f"& wait\" >/dev/null 2>&1 & wait"], pid_dir=tmp_path)
    await worker.start()
    await asyncio.to_thread(wait_for, ready.exists, 10)
    return worker


async def test_stop_waits_for_children_that_outlive_the_leader(tmp_path):
    done = tmp_path / "child-finished"
    # the child takes its time over SIGTERM after its shell has gone; the grace covers it
    worker = await start_with_child(tmp_path, "graceful",
                                    f"trap 'sleep 0.5; touch {done}; exit 0' TERM")
    assert worker.pid is not None
    assert await worker.stop(10) == -signal.SIGTERM
    assert done.exists()
    assert live_group(worker.pid) == []
    assert not (tmp_path / f"{worker.pid}.json").exists()


async def test_stop_kills_children_that_ignore_sigterm_after_the_grace(tmp_path):
    worker = await start_with_child(tmp_path, "stubborn", "trap '' TERM")
    assert worker.pid is not None
    started = time.monotonic()
    assert await worker.stop(0.5) == -signal.SIGTERM
    assert 0.4 < time.monotonic() - started < 5
    assert live_group(worker.pid) == []
    assert group_members(worker.pid, 0) == []


async def test_a_workers_error_lines_its_log_stamps_and_its_end_in_words(tmp_path):
    """What a crash report keeps: the lines that read as errors (however many ordinary lines
    came after them), a wall-clock stamp on every line of the worker's log file, and how
    the process ended in words."""
    from model_boss.backends.base import exit_story
    from model_boss.backends.processes import exit_words

    script = ("echo '2.20.649.927 I slot launch_slot_: id 0 | processing task'; "
              "echo 'E llama_model_load: failed to read the tensor data'; "
              "echo 'Traceback (most recent call last):'; "
              "for i in $(seq 60); do echo \"I ordinary line $i\"; done; exit 3")
    exited = asyncio.Event()
    worker = WorkerProcess("talky", ["sh", "-c", script], pid_dir=tmp_path,
                           log_file=tmp_path / "talky.log")
    worker.on_exit = lambda code: exited.set()
    await worker.start()
    await asyncio.wait_for(exited.wait(), 10)
    await worker.stop(1)
    assert worker.error_lines() == ["E llama_model_load: failed to read the tensor data",
                                    "Traceback (most recent call last):"]
    assert "ordinary" not in " ".join(worker.error_lines())
    logged = (tmp_path / "talky.log").read_text().splitlines()
    assert len(logged) == 63
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} "
    assert all(re.match(stamp, line) for line in logged), logged[:2]
    assert logged[0].endswith("I slot launch_slot_: id 0 | processing task")

    assert exit_words(3) == "exit status 3"
    assert exit_words(-9) == "killed by signal 9 (SIGKILL)"
    story = exit_story(type("Backend", (), {"process": worker})(), 3)
    assert story == ("worker stopped unexpectedly (exit status 3); its last error lines: "
                     "E llama_model_load: failed to read the tensor data | "
                     "Traceback (most recent call last):")


async def test_a_leader_that_died_a_moment_ago_is_known_exited_before_the_watcher_runs():
    """``exited()`` asks the kernel (the leader's pidfd): a SIGKILLed leader reads as exited
    with no turn of the event loop in between, so the exit watcher has not run."""
    worker = WorkerProcess("probe", ["sleep", "300"])
    await worker.start()
    try:
        assert worker.exited() is False and worker.running
        os.kill(worker.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while not worker.exited() and time.monotonic() < deadline:
            time.sleep(0.01)  # noqa: ASYNC251 (no await: the watcher cannot run)
        assert worker.exited() is True
        assert worker.running  # what the watcher would say: not known yet
    finally:
        await worker.stop(grace_s=1)
    assert worker.exited() is True and worker._pidfd is None  # its descriptor closed


async def test_wait_exit_returns_with_the_output_read_to_the_last_line(tmp_path):
    """A caller that reads the tail once ``wait_exit`` returns (a crash report, a template
    that fell back to the plain start) sees the last lines. Here they come 0.3 s after the
    leader ended, from a child of another session that holds the pipe."""
    late = "import time; time.sleep(0.3); print('the last line', flush=True)"
    script = (f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {late!r}], "
              "start_new_session=True); print('the leader ends', flush=True)")
    worker = WorkerProcess("late", [sys.executable, "-c", script], pid_dir=tmp_path)
    await worker.start()
    try:
        assert await worker.wait_exit(10) == 0
        assert worker.tail() == ["the leader ends", "the last line"]
    finally:
        await worker.stop(grace_s=1)
