"""A worker process's lifetime (diffusers, transformers): die with the coordinator, serve until
told to stop."""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psutil
from fastapi import FastAPI

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1


@contextmanager
def collector_paused(freeze: bool = False) -> Iterator[None]:
    """Python's cyclic garbage collector off while the block imports or loads (torch,
    diffusers, transformers, a model's modules: hundreds of thousands of objects that live as
    long as the worker), then on again as it was. Collecting as they came made the diffusers
    worker's imports a third dearer (6.7 s of CPU against 5.0 s here).

    ``freeze``, for a block that only imports: what it made is frozen out of the collector's
    later scans, so a worker forked from a template never writes to the template's pages when
    it collects (Python's own advice for a fork server). Not after a load: a reference cycle
    the load left could hold weights, and frozen it would never be freed; it goes at the next
    collection instead."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if enabled:
            gc.enable()


def set_pdeathsig() -> bool:
    """SIGKILL this process when the thread that started it ends (Linux); whether it took."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) == 0
    except (OSError, AttributeError):
        return False


def parent_check(parent_pid: int) -> Callable[[], bool] | None:
    """A check that ``parent_pid`` is still the process it is now (not gone, a zombie, or its
    number reused); None when it is gone already."""
    try:
        created = psutil.Process(parent_pid).create_time()
    except psutil.Error:
        return None

    def parent_alive() -> bool:
        try:
            parent = psutil.Process(parent_pid)
            return parent.create_time() == created and parent.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
        except psutil.Error:
            return True  # cannot tell (permissions): keep serving

    return parent_alive


def die_with_parent(parent_pid: int | None) -> None:
    """Exit when the coordinator goes: PR_SET_PDEATHSIG on Linux, and a 2 s watch on
    ``parent_pid`` (gone, a zombie, or its pid reused by another process)."""
    if not set_pdeathsig() and sys.platform.startswith("linux"):
        log.warning("prctl(PR_SET_PDEATHSIG) unavailable; relying on --parent-pid")
    if not parent_pid:
        return
    parent_alive = parent_check(parent_pid)
    if parent_alive is None:
        log.error("parent %s is already gone; exiting", parent_pid)
        os._exit(0)

    def watch() -> None:
        while parent_alive():
            time.sleep(2)
        log.warning("parent %s is gone; exiting", parent_pid)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def serve(app_factory: Callable[[Callable[[], None]], FastAPI], host: str, port: int,
          on_exit: Callable[[], Any]) -> None:
    """Run uvicorn until SIGTERM / SIGINT or ``stop()``; ``on_exit`` runs first on a signal
    (it cancels the admitted generations, so the graceful shutdown does not wait for them)."""
    import uvicorn

    class Server(uvicorn.Server):
        # uvicorn re-raises a caught SIGTERM after its graceful shutdown (exit status -15);
        # a worker told to stop that stopped cleanly exits 0 instead
        def handle_exit(self, sig: int, frame: Any) -> None:
            log.info("signal %s: cancelling generations, stopping", sig)
            stopping[0] = time.monotonic()
            on_exit()
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True

    server: Server | None = None
    stopping = [0.0]

    def stop() -> None:
        assert server is not None
        server.should_exit = True

    config = uvicorn.Config(app_factory(stop), host=host, port=port, log_level="warning",
                            timeout_graceful_shutdown=10)
    server = Server(config)
    server.run()
    if stopping[0]:
        log.info("server stopped %.2f s after the signal", time.monotonic() - stopping[0])
    # Nothing is left to save once the server has stopped; the interpreter's own teardown
    # (torch's and diffusers' modules, a cancelled step still finishing in its thread) took
    # 3-4 s on a busy 2-core box, long enough for a coordinator to give up and SIGKILL.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
