"""WorkerProcess: a child process in its own process group that dies with the coordinator.

Every worker the coordinator spawns goes through here: own session (so a stop reaches its
children), ``PR_SET_PDEATHSIG`` (so a SIGKILLed coordinator takes its workers along), a pid file
in ``state_dir/workers`` (so the next start reaps anything that still escaped), the tail of its
output kept for error messages, and an exit watcher that reports unexpected deaths at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


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
                 tail_lines: int = 40) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.pid_dir = pid_dir
        self.log_file = log_file
        self._tail: deque[str] = deque(maxlen=tail_lines)
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None
        self._watcher: asyncio.Task | None = None
        self._stopping = False
        self.on_exit: Callable[[int], None] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    def tail(self) -> list[str]:
        return list(self._tail)

    def last_line(self) -> str:
        lines = [line for line in self._tail if line.strip()]
        return lines[-1] if lines else ""

    async def start(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self._write_pid_file()
        self._reader = asyncio.create_task(self._read_output(), name=f"{self.name}-output")
        self._watcher = asyncio.create_task(self._watch_exit(), name=f"{self.name}-exit")
        log.info("worker %s started: pid %s: %s", self.name, self.pid, " ".join(self.argv))

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
                if sink:
                    sink.write(line + "\n")
        except Exception as exc:  # output reading must never take the coordinator down
            log.debug("output reader for %s ended: %s", self.name, exc)
        finally:
            if sink:
                sink.close()

    async def _watch_exit(self) -> None:
        assert self._proc
        code = await self._proc.wait()
        if self._reader:  # let the last lines arrive before anyone reads the tail
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._reader), 1.0)
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
        """The exit status if the process ends within ``timeout_s``, else None."""
        if self._proc is None:
            return None
        try:
            async with asyncio.timeout(timeout_s):
                return await self._proc.wait()
        except TimeoutError:
            return None

    async def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the process group, then SIGKILL after ``grace_s``; returns the exit code."""
        self._stopping = True
        proc = self._proc
        if proc is None:
            return None
        if proc.returncode is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), grace_s)
            except TimeoutError:
                log.warning("worker %s ignored SIGTERM for %.1fs; killing", self.name, grace_s)
                _signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
        _signal_group(proc.pid, signal.SIGKILL)  # anything left in its group
        for task in (self._watcher, self._reader):
            if task:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(task, 2.0)
        self._remove_pid_file()
        return proc.returncode

    # -- pid files ------------------------------------------------------------------------

    def _pid_file(self) -> Path | None:
        return self.pid_dir / f"{self.pid}.json" if self.pid_dir and self.pid else None

    def _write_pid_file(self) -> None:
        path = self._pid_file()
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            created = psutil.Process(self.pid).create_time()
            path.write_text(json.dumps({"pid": self.pid, "name": self.name,
                                        "create_time": created, "argv": self.argv,
                                        "parent": os.getpid()}))
        except (OSError, psutil.Error) as exc:
            log.warning("could not write pid file for %s: %s", self.name, exc)

    def _remove_pid_file(self) -> None:
        path = self._pid_file()
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def reap_orphans(pid_dir: Path) -> list[int]:
    """Kill workers a previous coordinator left behind (from their pid files); return pids."""
    reaped: list[int] = []
    if not pid_dir.is_dir():
        return reaped
    for path in pid_dir.glob("*.json"):
        try:
            record = json.loads(path.read_text())
            pid = int(record["pid"])
            proc = psutil.Process(pid)
            if abs(proc.create_time() - float(record["create_time"])) < 1.0:
                _signal_group(pid, signal.SIGKILL)
                with contextlib.suppress(psutil.Error):
                    proc.kill()
                reaped.append(pid)
                log.warning("reaped orphan worker %s (pid %d) from a previous run",
                            record.get("name"), pid)
        except (psutil.NoSuchProcess, ValueError, KeyError, OSError):
            pass
        except psutil.Error as exc:
            log.warning("could not reap %s: %s", path, exc)
        with contextlib.suppress(OSError):
            path.unlink()
    return reaped


def free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
