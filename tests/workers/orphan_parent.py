"""A coordinator stand-in: starts one WorkerProcess (pid file in ``--pid-dir``), prints its own
pid and the worker leader's, then waits. SIGKILL that pid to orphan the worker's group.

It runs under a parent of its own that is the subreaper of everything below and reaps it, so a
worker leader that dies is gone for good (no zombie still holding its pid), as under an init
that reaps; a container's PID 1 may not. That parent lives until it is killed.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import time
from pathlib import Path

from model_boss.backends.processes import WorkerProcess

_PR_SET_CHILD_SUBREAPER = 36


async def coordinator(pid_dir: Path, argv: list[str]) -> None:
    worker = WorkerProcess("orphan", argv, pid_dir=pid_dir)
    await worker.start()
    print(os.getpid(), worker.pid, flush=True)
    await asyncio.Event().wait()


def reap_forever() -> None:
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pid-dir", type=Path, required=True)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)
    if os.fork() == 0:
        asyncio.run(coordinator(args.pid_dir, args.argv))
    reap_forever()


if __name__ == "__main__":
    main()
