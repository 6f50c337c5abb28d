"""WorkerTemplates: Python workers forked from a process that has done their imports.

A diffusers or transformers worker spends most of its cold start importing torch, transformers
and diffusers (5 to 7 s of CPU on a small box) before it reads a byte of its model. The first
start of such a worker starts a *template* instead (``python -m workers.template``): it does
those imports once and then forks each worker of that module on request, in a few
milliseconds. A forked worker is the coordinator's worker like any other: its own session and
process group, a pid file, its output read by the coordinator, its exit status reported (by
the template, its parent), and stopped and killed the same way (:class:`WorkerProcess`).

One template per worker module and environment: what a library reads at import (thread
settings, ``HF_*``, ``PYTHONPATH``) comes from the template, so a worker whose environment
differs in more than its key and its GPUs gets a template of its own (at most
``MAX_TEMPLATES``), or starts the plain way. A template that cannot start, or dies, is not
asked again after ``MAX_FAILURES``; its workers start the plain way. ``worker_templates:
false`` turns templates off. A template exits with the coordinator; if it dies, the workers
it forked go with it (each dies with its parent) and their slots are reloaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
from typing import Any

import psutil

from ...settings import Settings
from .worker import WorkerProcess

log = logging.getLogger(__name__)

TEMPLATE_MODULES = frozenset({"workers.transformers", "workers.diffusers"})
PER_WORKER_ENV = frozenset({"WORKER_API_KEY", "CUDA_VISIBLE_DEVICES"})  # read after the fork
MAX_TEMPLATES = 4
MAX_FAILURES = 3
ANSWER_S = 10.0  # the template's answer to a fork request
_READY_LINE = "template ready"
_OUTPUT_LIMIT = 1 << 16  # a line of worker output, as asyncio's subprocess pipes take it


_FOLDER_PREFIX = "model-boss-templates-"


def clear_left_folders(root: str | None = None) -> list[str]:
    """Remove the socket folders of coordinators that are gone (one SIGKILLed leaves its
    folder behind; its templates died with it). A folder is named after its coordinator's
    pid; only this user's folders are looked at. Returns those removed."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        pid = name.removeprefix(_FOLDER_PREFIX).split("-", 1)[0]
        path = os.path.join(root, name)
        if not name.startswith(_FOLDER_PREFIX) or not pid.isdigit() or psutil.pid_exists(int(pid)):
            continue
        with contextlib.suppress(OSError):
            if os.stat(path).st_uid == os.getuid():
                shutil.rmtree(path)
                removed.append(path)
    return removed


class ForkedProcess:
    """A worker forked by a template, as :class:`WorkerProcess` sees a child: ``pid``,
    ``returncode`` (set once the template reports the exit) and ``stdout``."""

    def __init__(self, pid: int, stdout: asyncio.StreamReader, answers: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, given_env: dict[str, str]) -> None:
        self.pid = pid
        self.given_env = given_env
        self.stdout = stdout
        self.returncode: int | None = None
        self._pidfd: int | None = None  # this process, never a later holder of its number
        with contextlib.suppress(OSError, AttributeError):  # Linux 5.3+
            self._pidfd = os.pidfd_open(pid)
        self._exit = asyncio.create_task(self._watch(answers, writer), name=f"forked-{pid}")

    def _gone(self) -> bool:
        if self._pidfd is None:
            return not _alive(self.pid)
        return bool(select.select([self._pidfd], [], [], 0)[0])

    async def _watch(self, answers: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        code: int | None = None
        try:
            line = await answers.readline()
            code = int(json.loads(line)["exit"]) if line else None
        except (ValueError, KeyError, TypeError, OSError) as exc:
            log.debug("template answer for pid %s: %s", self.pid, exc)
        finally:
            writer.close()
        try:
            if code is None:  # the template went first: the worker dies with it, by SIGKILL
                while not self._gone():  # noqa: ASYNC110 (not our child: no exit to wait on)
                    await asyncio.sleep(0.05)
                code = -signal.SIGKILL
            self.returncode = code
        finally:
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class _Template:
    def __init__(self, module: str, env: dict[str, str], folder: str, settings: Settings,
                 number: int) -> None:
        self.module = module
        self.env = env
        self.path = os.path.join(folder, f"{number}.sock")
        short = module.rsplit(".", 1)[-1]
        state = settings.state_path
        self.process = WorkerProcess(
            f"template-{short}-{number}",
            [sys.executable, "-m", "workers.template", "--module", module, "--socket", self.path,
             "--parent-pid", str(os.getpid())],
            env=env, pid_dir=state / "workers", log_file=state / "logs" / f"template-{short}.log")
        self.ready = asyncio.Event()
        self.started_at = time.monotonic()
        self.ready_s: float | None = None
        self.forks = 0

    def _saw(self, line: str) -> None:
        if line.startswith(_READY_LINE) and not self.ready.is_set():
            self.ready_s = round(time.monotonic() - self.started_at, 3)
            self.ready.set()

    async def start(self) -> None:
        self.process.on_line = self._saw
        await self.process.start()

    async def wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.ready.is_set():
            if not self.process.running or time.monotonic() > deadline:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ready.wait(), 0.1)
        return self.process.running

    async def fork(self, args: list[str], env: dict[str, str]) -> ForkedProcess:
        loop = asyncio.get_running_loop()
        read_end, write_end = os.pipe()
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                await asyncio.wait_for(loop.sock_connect(sock, self.path), ANSWER_S)
                payload = json.dumps({"argv": args, "env": env}).encode() + b"\n"
                sock.setblocking(True)  # a few KB to a local socket: sent at once
                sock.settimeout(ANSWER_S)
                socket.send_fds(sock, [payload], [write_end])
                sock.setblocking(False)
                answers, writer = await asyncio.open_unix_connection(sock=sock)
            except BaseException:
                sock.close()
                raise
        finally:
            os.close(write_end)
        try:
            line = await asyncio.wait_for(answers.readline(), ANSWER_S)
            answer = json.loads(line) if line else {}
            if "pid" not in answer:
                raise OSError(answer.get("error") or "the template closed the connection")
            stdout = asyncio.StreamReader(limit=_OUTPUT_LIMIT)
            pipe = os.fdopen(read_end, "rb", buffering=0)
            read_end = -1
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdout), pipe)
        except BaseException:
            writer.close()
            if read_end >= 0:
                os.close(read_end)
            raise
        self.forks += 1
        given = {k: env[k] for k in PER_WORKER_ENV if k in env}  # all that differs
        return ForkedProcess(int(answer["pid"]), stdout, answers, writer, given)

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.module, "pid": self.process.pid, "ready": self.ready.is_set(),
                "ready_s": self.ready_s, "forks": self.forks}


class WorkerTemplates:
    """The coordinator's templates, started on first need, one per module and environment."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.modules = TEMPLATE_MODULES
        self._templates: dict[str, _Template] = {}
        self._failures: dict[str, int] = {}
        self._folder: str | None = None
        self._numbers = 0

    def module_of(self, argv: list[str]) -> str | None:
        """The worker module ``argv`` starts, if a template can start it instead."""
        if (self.settings.worker_templates and len(argv) >= 3 and argv[0] == sys.executable
                and argv[1] == "-m" and argv[2] in self.modules):
            return argv[2]
        return None

    async def spawn(self, argv: list[str], env: dict[str, str] | None) -> ForkedProcess | None:
        """``argv`` forked from its template, or None: start it the plain way."""
        module = self.module_of(argv)
        if module is None:
            return None
        env = dict(os.environ if env is None else env)
        template_env = {k: v for k, v in env.items() if k not in PER_WORKER_ENV}
        key = module + ":" + hashlib.sha256(
            json.dumps(template_env, sort_keys=True).encode()).hexdigest()[:16]
        if self._failures.get(key, 0) >= MAX_FAILURES:
            return None
        template = self._templates.get(key)
        if template is not None and not template.process.running:
            self._forget(key, "exited")
            template = None
        if template is None:
            if len(self._templates) >= MAX_TEMPLATES:
                return None
            template = await self._start(key, module, template_env)
            if template is None:
                return None
        if not await template.wait_ready(self.settings.health_timeout_s):
            self._forget(key, "did not become ready: " + template.process.last_line())
            return None
        try:
            return await template.fork(argv[3:], env)
        except (OSError, ValueError, TimeoutError) as exc:
            self._forget(key, f"could not fork: {exc}")
            return None

    async def _start(self, key: str, module: str, env: dict[str, str]) -> _Template | None:
        if self._folder is None:
            clear_left_folders()
            self._folder = tempfile.mkdtemp(prefix=f"{_FOLDER_PREFIX}{os.getpid()}-")  # 0700
        self._numbers += 1
        template = _Template(module, env, self._folder, self.settings, self._numbers)
        self._templates[key] = template
        try:
            await template.start()
        except OSError as exc:
            self._forget(key, f"could not start: {exc}")
            return None
        return template

    def _forget(self, key: str, why: str) -> None:
        template = self._templates.pop(key, None)
        self._failures[key] = self._failures.get(key, 0) + 1
        log.warning("worker template %s %s; its workers start the plain way%s",
                    template.module if template else key, why,
                    "" if self._failures[key] < MAX_FAILURES else " from now on")
        if template is not None:
            asyncio.get_running_loop().create_task(
                template.process.stop(self.settings.stop_grace_s))

    def status(self) -> list[dict[str, Any]]:
        return [template.to_dict() for template in self._templates.values()]

    async def shutdown(self) -> None:
        templates, self._templates = list(self._templates.values()), {}
        await asyncio.gather(*(t.process.stop(self.settings.stop_grace_s) for t in templates),
                             return_exceptions=True)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
