"""What is left of a worker's process group, read from the kernel independently of the code
under test (for the orphan tests)."""

from __future__ import annotations

import contextlib
import os
import signal

import psutil


def live_group(pgid: int) -> list[int]:
    """Every live (not zombie) process whose process group is ``pgid``, whatever its age."""
    found = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (OSError, psutil.Error):
            continue
    return found


def kill_leftovers(pgid: int) -> None:
    """Test cleanup: SIGKILL whatever is still alive in process group ``pgid``."""
    for pid in live_group(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
