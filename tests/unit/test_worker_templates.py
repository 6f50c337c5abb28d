"""Workers forked from a template (backends/processes/templates.py, workers/template.py): each
is the coordinator's worker as a freshly started one would be (its own session, its output read,
its exit status known, stopped and killed the same way), only the imports come from the
template, and when the template cannot serve, the worker starts the plain way.

Real processes throughout; the worker is ``tests.workers.forkme``, which says what it was
given."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys

import psutil
import pytest

from model_boss.backends.processes import WorkerProcess, WorkerTemplates
from model_boss.backends.processes.templates import clear_left_folders
from model_boss.settings import Settings
from tests.conftest import ROOT

MODULE = "tests.workers.forkme"


@pytest.fixture
async def templates(tmp_path):
    made = WorkerTemplates(Settings(state_dir=tmp_path / "state", health_timeout_s=60,
                                    stop_grace_s=2))
    made.modules = frozenset({MODULE})
    yield made
    await made.shutdown()


def env(**more: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **more}


def worker(templates: WorkerTemplates, *args: str, **more: str) -> WorkerProcess:
    return WorkerProcess("forkme", [sys.executable, "-m", MODULE, *args], env=env(**more),
                         templates=templates, pid_dir=templates.settings.state_path / "workers")


async def until(predicate, timeout_s: float = 30) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():  # noqa: ASYNC110 (a process's output: no event to wait on)
            await asyncio.sleep(0.02)


async def first_line(process: WorkerProcess) -> dict[str, str]:
    await until(process.tail)
    line = process.tail()[0]
    return dict(re.findall(r"(\w+)=([^ ]+)", line)) | {"line": line}


async def test_a_forked_worker_is_a_worker_like_any_other(templates):
    process = worker(templates, "sleep", WORKER_API_KEY="k1", CUDA_VISIBLE_DEVICES="1")
    await process.start()
    said = await first_line(process)
    template = templates.status()[0]
    assert template["forks"] == 1 and template["ready"], template
    assert said.get("pid") == str(process.pid) and said["ppid"] == str(template["pid"]), said
    assert said["sid"] == str(process.pid)  # its own session: a stop reaches its group
    assert said["key"] == "k1" and said["gpus"] == "1" and said["cgpus"] == "1", said
    # nothing of the template's is left open in it: its input, its output twice, and the
    # descriptor its own listing of them takes
    assert said["fds"] == "0,1,2,3", said
    assert "'sleep'" in said["line"] and "main=__main__" in said["line"]
    # the template's imports are frozen out of the collector's scans, which run in the worker
    assert said["collector"] == "True" and int(said["frozen"]) > 10_000, said
    assert process.running and process.exited() is False
    # its pid file keeps what /proc/PID/environ (the template's) cannot show, for this user
    record = templates.settings.state_path / "workers" / f"{process.pid}.json"
    assert json.loads(record.read_text())["env"] == {"WORKER_API_KEY": "k1",
                                                     "CUDA_VISIBLE_DEVICES": "1"}
    assert record.stat().st_mode & 0o777 == 0o600
    if importlib.util.find_spec("setproctitle"):  # ps shows the worker's command line
        shown = " ".join(psutil.Process(process.pid).cmdline()).split()
        assert shown == [sys.executable, "-m", MODULE, "sleep"], shown
    code = await process.stop(grace_s=5)
    assert code == -signal.SIGTERM, code
    # the template, its parent, reaps it: no zombie is left behind
    await until(lambda: not psutil.pid_exists(process.pid), 10)


async def test_exit_codes_and_the_output_come_back(templates):
    process = worker(templates, "exit", "3")
    exited: list[int] = []
    await process.start()
    process.on_exit = exited.append
    assert await process.wait_exit(30) == 3
    await until(lambda: exited, 10)
    assert exited == [3] and "argv=['exit', '3']" in process.tail()[0]


async def test_one_template_serves_workers_that_differ_in_key_and_gpus_only(templates):
    first = worker(templates, "exit", "0", WORKER_API_KEY="a", CUDA_VISIBLE_DEVICES="0")
    second = worker(templates, "exit", "0", WORKER_API_KEY="b", CUDA_VISIBLE_DEVICES="1")
    await first.start()
    await second.start()
    assert [t["forks"] for t in templates.status()] == [2]
    other = worker(templates, "exit", "0", OMP_NUM_THREADS="7")  # read at import: its own
    await other.start()
    assert sorted(t["forks"] for t in templates.status()) == [1, 2]
    for process in (first, second, other):
        assert await process.wait_exit(30) == 0


async def test_a_worker_that_ignores_sigterm_is_killed(templates):
    process = worker(templates, "ignore-term")
    await process.start()
    await first_line(process)
    assert await process.stop(grace_s=0.5) == -signal.SIGKILL


async def test_when_the_template_dies_its_workers_go_and_the_next_starts_anew(templates):
    process = worker(templates, "sleep")
    await process.start()
    await first_line(process)
    old = templates.status()[0]["pid"]
    os.kill(old, signal.SIGKILL)
    assert await process.wait_exit(30) == -signal.SIGKILL  # it dies with its parent
    again = worker(templates, "exit", "0")
    await again.start()
    assert await again.wait_exit(30) == 0
    assert templates.status()[0]["pid"] != old


async def test_a_template_that_cannot_start_leaves_the_plain_start(templates):
    module = "tests.no_such_package.worker"  # the template imports its package, and fails
    templates.modules = frozenset({MODULE, module})
    process = WorkerProcess("missing", [sys.executable, "-m", module], env=env(),
                            templates=templates)
    await process.start()  # the template fails its imports; the plain start runs instead
    assert await process.wait_exit(30) == 1
    assert "No module named" in " ".join(process.tail())
    assert templates.status() == []
    log = (templates.settings.state_path / "logs" / "template-worker.log").read_text()
    assert "No module named 'tests.no_such_package'" in log, log  # the template was tried


async def test_templates_off_start_the_plain_way(tmp_path):
    off = WorkerTemplates(Settings(state_dir=tmp_path / "state", worker_templates=False))
    off.modules = frozenset({MODULE})
    process = worker(off, "exit", "0")
    await process.start()
    said = await first_line(process)
    assert said["ppid"] == str(os.getpid()) and off.status() == []
    assert said["collector"] == "True" and said["frozen"] == "0", said
    assert await process.wait_exit(30) == 0


async def test_a_template_whose_imports_start_a_thread_refuses_to_fork(templates):
    """A fork copies only the forking thread (a lock another held would stay held), so a
    template whose imports started one exits, saying so, and the worker starts plainly."""
    module = "tests.workers.threaded.run"
    templates.modules = frozenset({module})
    process = WorkerProcess("threaded", [sys.executable, "-m", module], env=env(),
                            templates=templates)
    await process.start()
    assert await process.wait_exit(30) == 0
    assert process.tail() == [f"ran ppid={os.getpid()}"]  # a child of ours, not a fork
    assert templates.status() == []
    log = (templates.settings.state_path / "logs" / "template-run.log").read_text()
    assert "refuses to fork: the imports started threads: started-at-import" in log, log


def test_socket_folders_of_gone_coordinators_are_cleared(tmp_path):
    """A SIGKILLed coordinator leaves its templates' socket folder; the next one clears it,
    and never a live coordinator's folder or anything else."""
    import subprocess

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    left = tmp_path / f"model-boss-templates-{gone.pid}-abc"
    live = tmp_path / f"model-boss-templates-{os.getpid()}-def"
    other = tmp_path / "model-boss-templates-notapid"
    for folder in (left, live, other):
        folder.mkdir()
        (folder / "1.sock").write_text("")
    assert clear_left_folders(str(tmp_path)) == [str(left)]
    assert not left.exists() and live.exists() and other.exists()


def test_the_collector_is_off_inside_a_paused_block_and_back_as_it_was_after():
    """workers/process.py: a worker's imports and load run with the cyclic collector off; it is
    on again after only if it was on before, and what the block made is frozen only when
    asked (imports: a load's leftovers must stay collectable)."""
    from workers.process import collector_paused

    assert gc.isenabled()
    before = gc.get_freeze_count()
    try:
        with collector_paused():
            assert not gc.isenabled()
            made = [[n] for n in range(5_000)]  # containers the collector tracks
        assert gc.isenabled() and gc.get_freeze_count() == before
        with collector_paused(freeze=True):
            made = [[n] for n in range(5_000)]
        assert gc.isenabled() and gc.get_freeze_count() >= before + len(made)
        gc.disable()
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()


def test_python_m_model_boss_runs_its_command_with_the_collector_on():
    """``python -m model_boss`` turns the collector off before it imports the command's
    modules; ``model_boss.cli.dispatch`` turns it on before the command runs (``serve`` pauses it
    again for its app, then freezes)."""
    code = ("import gc, runpy, sys; import model_boss.cli.dispatch as cli; seen = []; "
            "real = cli.build_parser; "
            "cli.build_parser = lambda: seen.append(gc.isenabled()) or real(); "
            "sys.modules['model_boss.cli.dispatch'] = cli; "
            "sys.argv = ['model_boss', 'simulate', '--help']\n"
            "try: runpy.run_module('model_boss', run_name='__main__')\n"
            "except SystemExit: print(seen, gc.isenabled())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "[True] True", out.stdout + out.stderr
