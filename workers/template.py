"""``python -m workers.template --module workers.transformers --socket PATH --parent-pid N``:
a worker template. It imports what a worker of ``--module`` needs (torch, transformers,
diffusers: seconds of CPU each time a Python worker starts), then forks a new worker for each
request on a Unix socket, so a cold start costs a fork instead of those imports.

One request per connection: a JSON line ``{"argv": [...], "env": {...}}`` that carries the
worker's output pipe as an ``SCM_RIGHTS`` file descriptor. The template answers
``{"pid": N}`` and, when that worker exits, ``{"exit": CODE}`` (a negative code: killed by
that signal), then closes the connection.

The worker it forks starts its own session (a stop reaches its whole group), takes the
environment it was given, writes to the pipe it was given and runs ``--module`` as
``python -m`` would, with the arguments it was given. Only what is read once, at import,
comes from the template: the coordinator starts one template per module and environment
(less the worker's key and its GPUs, which are read later), so that is the same as a fresh
start would have had.

The template is single-threaded (a fork copies only the thread that forks), touches no CUDA
API (``CUDA_VISIBLE_DEVICES`` is a worker's own) and exits with the coordinator.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import time
from typing import Any

from .process import collector_paused, parent_check, set_pdeathsig

try:  # imported here, before any fork: it finds the command line's memory at import
    import setproctitle as _setproctitle
except ImportError:
    _setproctitle = None

# what each worker module's start imports, ahead of its first worker (its own heavy parts)
PREIMPORTS = {
    "workers.transformers": ("workers.transformers.engine:preimport", "workers.transformers.app"),
    "workers.diffusers": ("workers.diffusers.loader:preimport", "workers.diffusers.app"),
}
MAX_REQUEST_BYTES = 1 << 20
PARENT_CHECK_S = 2.0


def preimport(module: str) -> None:
    """The module's heavy imports; for another module, its package (never the module
    itself: ``runpy`` runs that as ``__main__`` in each worker)."""
    for name in PREIMPORTS.get(module, tuple(filter(None, [module.rpartition(".")[0]]))):
        target, _, function = name.partition(":")
        imported = importlib.import_module(target)
        if function:
            getattr(imported, function)()


def fork_hazard() -> str | None:
    """What the imports left that a fork must not copy: a CUDA context (a child cannot use
    its parent's), or a Python thread (a fork copies only the thread that forks, and a lock
    another thread held stays held in the child)."""
    import threading

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "the imports initialized CUDA"
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if others:
        return f"the imports started threads: {', '.join(others)}"
    return None


def _retitle(argv: list[str]) -> None:
    """``ps`` and ``/proc/PID/cmdline`` show the worker's own command line, not the
    template's (setproctitle, where installed)."""
    if _setproctitle is not None:
        _setproctitle.setproctitle(" ".join(argv))


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], int]:
    """The request line and the output pipe's descriptor that came with it."""
    data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 1)
    while not data.endswith(b"\n"):
        if not data and not fds:
            raise ValueError("the connection closed before the request")
        more = conn.recv(65536)
        if not more or len(data) > MAX_REQUEST_BYTES:
            raise ValueError("an unterminated request")
        data += more
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise ValueError("a request comes with exactly one output descriptor")
    request = json.loads(data)
    if not isinstance(request.get("argv"), list) or not isinstance(request.get("env"), dict):
        os.close(fds[0])
        raise ValueError("a request is {argv: [...], env: {...}}")
    return request, fds[0]


def _become_worker(module: str, request: dict[str, Any], output: int,
                   keep_closed: list[int]) -> None:
    """In the forked child: never returns."""
    code = 1
    try:
        for fd in keep_closed:
            try:
                os.close(fd)
            except OSError:
                pass
        os.setsid()
        set_pdeathsig()  # dies with the template, which dies with the coordinator
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(devnull)
        os.close(output)
        sys.argv = [module, *[str(arg) for arg in request["argv"]]]
        _retitle([sys.executable, "-m", *sys.argv])  # before the environment changes
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in request["env"].items()})
        import runpy

        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


class Template:
    def __init__(self, module: str, path: str, parent_pid: int | None) -> None:
        self.module = module
        self.path = path
        self.parent_pid = parent_pid
        self.parent_alive = parent_check(parent_pid) if parent_pid else (lambda: True)
        self.children: dict[int, socket.socket] = {}
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def serve(self) -> None:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector through wake_w
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.listener.bind(self.path)
        os.chmod(self.path, 0o600)
        self.listener.listen(64)
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        print(f"template ready: {self.module} on {self.path}", flush=True)
        last_check = time.monotonic()
        while True:
            for key, _ in self.selector.select(PARENT_CHECK_S):
                if key.data == "accept":
                    self._accept()
                else:
                    try:
                        os.read(self.wake_r, 4096)
                    except BlockingIOError:
                        pass
            self._reap()
            if time.monotonic() - last_check >= PARENT_CHECK_S:
                last_check = time.monotonic()
                if self.parent_alive is None or not self.parent_alive():
                    print(f"template: parent {self.parent_pid} is gone; exiting", flush=True)
                    return

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        conn.settimeout(10)
        try:
            request, output = _read_request(conn)
        except (OSError, ValueError) as exc:
            self._answer(conn, {"error": str(exc)})
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _become_worker(self.module, request, output,
                           [self.listener.fileno(), conn.fileno(), self.wake_r, self.wake_w,
                            self.selector.fileno(),
                            *[c.fileno() for c in self.children.values()]])
        os.close(output)
        self.children[pid] = conn
        self._answer(conn, {"pid": pid})

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                self._answer(conn, {"exit": os.waitstatus_to_exitcode(status)})
                conn.close()

    @staticmethod
    def _answer(conn: socket.socket, message: dict[str, Any]) -> None:
        try:
            conn.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            pass  # the coordinator stopped listening for this worker


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="fork Python workers with their imports done")
    parser.add_argument("--module", required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--parent-pid", type=int)
    args = parser.parse_args(argv)
    set_pdeathsig()
    if args.parent_pid and parent_check(args.parent_pid) is None:
        sys.exit(0)
    started = time.perf_counter()
    with collector_paused(freeze=True):  # the workers it forks share these pages
        preimport(args.module)
    print(f"template imports of {args.module} took {time.perf_counter() - started:.2f}s",
          flush=True)
    unsafe = fork_hazard()
    if unsafe:  # the coordinator then starts this module's workers the plain way
        print(f"template refuses to fork: {unsafe}", flush=True)
        sys.exit(1)
    template = Template(args.module, args.socket, args.parent_pid)
    try:
        template.serve()
    finally:
        try:
            os.unlink(args.socket)
        except OSError:
            pass


if __name__ == "__main__":
    main()
