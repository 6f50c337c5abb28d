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


STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def block_stop_signals() -> None:
    """Block SIGTERM / SIGINT in this thread and every thread started after (llama.cpp's
    among them), so only :func:`wait_for_stop` takes them, and can say who sent them."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def wait_for_stop(failed: threading.Event, tick_s: float = 0.5) -> str:
    """Wait for SIGTERM / SIGINT (or ``failed``); what ended the wait, for the log."""
    while not failed.is_set():
        info = signal.sigtimedwait(STOP_SIGNALS, tick_s)
        if info is not None:
            return f"signal {signal.Signals(info.si_signo).name} from pid {info.si_pid}"
    return "failure"
