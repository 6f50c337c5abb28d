"""WorkerProcess: a child process in its own process group that dies with the coordinator.

Every worker the coordinator spawns goes through here: own session (so a stop reaches its
children), ``PR_SET_PDEATHSIG`` (so a SIGKILLed coordinator takes the worker's leader along), a
pid file in ``state_dir/workers`` naming the worker's process group and its leader's start time
(so the next start reaps the whole group, grandchildren whose leader already died included), the
tail of its output kept for error messages, and an exit watcher that reports unexpected deaths
at once and kills whatever the dead leader left in its group.

The leader is the worker: when it exits, the rest of its process group goes too (groups.py
says who is in a group).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import re
import select
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import psutil

from .groups import group_members, kill_group, signal_group

log = logging.getLogger(__name__)

# a line of worker output that reads as an error: its words, or llama.cpp's level letter
_ERROR_LINE = re.compile(r"\b(?:error|fatal|failed|failure|exception|traceback|abort(?:ed)?|"
                         r"out of memory|segmentation fault|terminate called)\b", re.IGNORECASE)
_LEVEL_E = re.compile(r"^(?:[\d.:]+\s+)?E\s")


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"


def exit_words(code: int | None) -> str:
    """How a process ended, in words: "killed by signal 9 (SIGKILL)", "exit status 1"."""
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        return f"killed by signal {-code}"
    return f"exit status {code}"

_PR_SET_PDEATHSIG = 1
_POLL_S = 0.05
_KILL_WAIT_S = 5.0


class Child(Protocol):
    """A started worker as :class:`WorkerProcess` watches it: asyncio's subprocess, or one a
    template forked (templates.py)."""

    pid: int
    returncode: int | None
    stdout: asyncio.StreamReader | None


class Forked(Child, Protocol):
    given_env: dict[str, str]  # what the worker was given beyond its template's environment


class Forker(Protocol):
    """Starts a worker some cheaper way than a new interpreter (templates.py), or says no."""

    async def spawn(self, argv: list[str], env: dict[str, str] | None) -> Forked | None: ...


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass


class WorkerProcess:
    """Owns one child process: start, output tail, exit watch, graceful then forced stop."""

    def __init__(self, name: str, argv: list[str], *, env: dict[str, str] | None = None,
                 pid_dir: Path | None = None, log_file: Path | None = None,
                 tail_lines: int = 40, templates: Forker | None = None) -> None:
        self.name = name
        self.templates = templates  # forks the worker from its template, where there is one
        self.forked_env: dict[str, str] | None = None  # set when a template forked it
        self.argv = argv
        self.env = env
        self.pid_dir = pid_dir
        self.log_file = log_file
        self._tail: deque[str] = deque(maxlen=tail_lines)
        self._errors: deque[str] = deque(maxlen=tail_lines)  # what error_lines() returns
        self.on_line: Callable[[str], None] | None = None  # each output line, as it comes
        self._proc: Child | None = None
        self._started_at = 0.0  # the leader's create_time: the group's lower age bound
        self._reader: asyncio.Task | None = None
        self._watcher: asyncio.Task | None = None
        self._stopping = False
        self._pidfd: int | None = None  # the leader's, polled by exited()
        self._exit_poll: select.poll | None = None
        self.on_exit: Callable[[int], None] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def pgid(self) -> int | None:
        """The worker's process group: its own session, so the leader's pid."""
        return self.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    def exited(self) -> bool | None:
        """Whether the leader has exited, asked of the kernel rather than the exit watcher, so
        a leader that died a moment ago (not reaped yet) counts: one poll of its pidfd, which
        is readable once it exits (and names this process, never a reused number). None: no
        pidfd to ask (the caller asks /proc)."""
        if self._proc is None or self._proc.returncode is not None:
            return True
        return bool(self._exit_poll.poll(0)) if self._exit_poll is not None else None

    def _open_pidfd(self) -> None:
        assert self._proc is not None
        with contextlib.suppress(OSError, AttributeError):  # Linux 5.3+; gone already
            self._pidfd = os.pidfd_open(self._proc.pid)
            self._exit_poll = select.poll()
            self._exit_poll.register(self._pidfd, select.POLLIN)

    def _close_pidfd(self) -> None:
        pidfd, self._pidfd, self._exit_poll = self._pidfd, None, None
        if pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(pidfd)

    def tail(self) -> list[str]:
        return list(self._tail)

    def error_lines(self, lines: int = 5) -> list[str]:
        """The last ``lines`` lines of output that read as errors (llama.cpp's ``E`` lines,
        Python's tracebacks and ERROR records, "error", "failed", "fatal" and the like)."""
        return list(self._errors)[-lines:]

    def last_line(self) -> str:
        lines = [line for line in self._tail if line.strip()]
        return lines[-1] if lines else ""

    async def start(self) -> None:
        spawned_at = time.time()
        forked = await self.templates.spawn(self.argv, self.env) if self.templates else None
        self.forked_env = forked.given_env if forked is not None else None
        self._proc = forked or await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        try:
            self._started_at = psutil.Process(self._proc.pid).create_time()
        except psutil.Error:  # already gone and reaped: the spawn time bounds it as well
            self._started_at = spawned_at
        self._open_pidfd()
        self._write_pid_file()
        self._reader = asyncio.create_task(self._read_output(), name=f"{self.name}-output")
        self._watcher = asyncio.create_task(self._watch_exit(), name=f"{self.name}-exit")
        log.info("worker %s started%s: pid %s: %s", self.name,
                 " (forked from its template)" if forked else "", self.pid, " ".join(self.argv))

    async def _read_output(self) -> None:
        assert self._proc and self._proc.stdout
        sink = None
        if self.log_file:
            with contextlib.suppress(OSError):
                self.log_file.parent.mkdir(parents=True, exist_ok=True)
                sink = self.log_file.open("a", buffering=1)
        try:
            async for raw in self._proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                self._tail.append(line)
                if _ERROR_LINE.search(line) or _LEVEL_E.match(line):
                    self._errors.append(line)
                if self.on_line is not None:
                    self.on_line(line)
                if sink:  # stamped with the wall clock: a worker's own stamps are relative
                    sink.write(f"{_stamp()} {line}\n")
        except Exception as exc:  # output reading must never take the coordinator down
            log.debug("output reader for %s ended: %s", self.name, exc)
        finally:
            if sink:
                sink.close()

    async def _leader_exit(self) -> int:
        """The leader's exit status once it has exited.

        Not ``Process.wait()``: before Python 3.12 it also waits for the output pipe to close,
        which a grandchild still holding it delays for as long as that grandchild lives.
        """
        assert self._proc
        while self._proc.returncode is None:  # noqa: ASYNC110 (the child watcher sets it)
            await asyncio.sleep(_POLL_S)
        return self._proc.returncode

    async def _kill_group(self) -> list[int]:
        """SIGKILL what is left of the group and wait until it is gone (what it held, VRAM
        included, is free once this returns), a few seconds at most."""
        assert self.pgid is not None
        killed = await asyncio.to_thread(kill_group, self.pgid, self._started_at)
        if killed and not await self._group_gone(_KILL_WAIT_S):
            log.warning("worker %s: %s still there %.0fs after SIGKILL", self.name, killed,
                        _KILL_WAIT_S)
        return killed

    async def _watch_exit(self) -> None:
        code = await self._leader_exit()
        self._close_pidfd()
        if self._stopping:
            return  # stop() owns the rest of the group and the pid file
        left = await self._kill_group()
        if left:
            log.warning("worker %s: killed %d processes its leader left behind: %s",
                        self.name, len(left), left)
        await self._drained()  # the last lines in before anyone reads the tail
        self._remove_pid_file()
        if not self._stopping:
            log.warning("worker %s (pid %s) exited unexpectedly with %s; last output: %s",
                        self.name, self.pid, code, self.last_line())
            if self.on_exit:
                try:
                    self.on_exit(code)
                except Exception:
                    log.exception("exit handler for %s failed", self.name)

    async def wait_exit(self, timeout_s: float) -> int | None:
        """The leader's exit status if it ends within ``timeout_s``, else None; when it
        ended, its output is read to the last line (see :meth:`tail`) before this returns."""
        if self._proc is None:
            return None
        try:
            async with asyncio.timeout(timeout_s):
                code = await self._leader_exit()
        except TimeoutError:
            return None
        await self._drained()
        return code

    async def _drained(self, timeout_s: float = 1.0) -> None:
        """Until the output reader has read what the process wrote (its pipe closed), for
        ``timeout_s`` at most: a child that outlives the leader can hold the pipe open."""
        if self._reader:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._reader), timeout_s)

    async def _group_gone(self, timeout_s: float) -> bool:
        """Whether the leader and everything in its group exit within ``timeout_s``."""
        assert self.pgid is not None
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.running and not await asyncio.to_thread(
                    group_members, self.pgid, self._started_at):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_POLL_S if self.running else 0.1)

    async def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL what is left of it after ``grace_s`` (children
        that outlive the leader included); returns the leader's exit code."""
        self._stopping = True
        if self._proc is None or self.pgid is None:
            return None
        if self.running or await asyncio.to_thread(group_members, self.pgid,
                                                   self._started_at):
            signal_group(self.pgid, signal.SIGTERM)
            if not await self._group_gone(grace_s):
                log.warning("worker %s ignored SIGTERM for %.1fs; killing", self.name, grace_s)
        await self._kill_group()  # anything left in its group
        code = await self._leader_exit()
        self._close_pidfd()
        for task in (self._watcher, self._reader):
            if task:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(task, 2.0)
        self._remove_pid_file()
        return code

    # -- pid files ------------------------------------------------------------------------

    def _pid_file(self) -> Path | None:
        return self.pid_dir / f"{self.pid}.json" if self.pid_dir and self.pid else None

    def _write_pid_file(self) -> None:
        path = self._pid_file()
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            record = {"pid": self.pid, "pgid": self.pgid, "name": self.name,
                      "create_time": self._started_at, "argv": self.argv,
                      "parent": os.getpid()}
            if self.forked_env is not None:
                # a forked worker's /proc/PID/environ is its template's: what it was given
                # on top of that is kept here (its key too: readable by this user alone, as
                # /proc/PID/environ is)
                record["env"] = self.forked_env
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(json.dumps(record))
        except OSError as exc:
            log.warning("could not write pid file for %s: %s", self.name, exc)

    def _remove_pid_file(self) -> None:
        path = self._pid_file()
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()


def free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
