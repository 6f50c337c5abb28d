"""The worker process's lifetime: die with the coordinator, stop on SIGTERM / SIGINT."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
WATCH_INTERVAL_S = 1.0


def _parent_gone(parent_pid: int, created: float) -> bool:
    """Gone, a zombie, or its pid now taken by a younger process."""
    try:
        with open(f"/proc/{parent_pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return True
    return fields[0] in (b"Z", b"X") or float(fields[19]) != created


def _start_ticks(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return float(stat.read().rsplit(b")", 1)[1].split()[19])


def die_with_parent(parent_pid: int | None) -> None:
    """Exit when the coordinator goes: PR_SET_PDEATHSIG (fires when the *thread* that forked
    us ends, not only the process), and a watch on ``parent_pid`` for the rest."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if not parent_pid:
        return
    try:
        created = _start_ticks(parent_pid)
    except (OSError, IndexError, ValueError):
        print(f"parent {parent_pid} is already gone; exiting", file=sys.stderr, flush=True)
        os._exit(0)

    def watch() -> None:
        while not _parent_gone(parent_pid, created):
            time.sleep(WATCH_INTERVAL_S)
        print(f"parent {parent_pid} is gone; exiting", file=sys.stderr, flush=True)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def stop_event() -> threading.Event:
    """Set on SIGTERM or SIGINT; the main thread waits on it."""
    stop = threading.Event()

    def handle(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    return stop
