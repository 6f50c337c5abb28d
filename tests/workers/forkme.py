"""A worker for the template tests: says what it was given, then does what its first argument
asks (``exit N``, ``sleep``, ``ignore-term``)."""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import sys
import time


def c_getenv(name: str) -> str | None:
    """What C code (the CUDA driver) reads, not Python's copy."""
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    value = libc.getenv(name.encode())
    return value.decode() if value is not None else None


def main() -> None:
    print(f"argv={sys.argv[1:]} key={os.environ.get('WORKER_API_KEY')} "
          f"cgpus={c_getenv('CUDA_VISIBLE_DEVICES')} "
          f"gpus={os.environ.get('CUDA_VISIBLE_DEVICES')} sid={os.getsid(0)} pid={os.getpid()} "
          f"ppid={os.getppid()} main={__name__} collector={gc.isenabled()} "
          f"frozen={gc.get_freeze_count()} "
          f"fds={','.join(sorted(os.listdir('/proc/self/fd'), key=int))}", flush=True)
    action = sys.argv[1] if len(sys.argv) > 1 else "exit"
    if action == "exit":
        sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    if action == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(0.1)


if __name__ == "__main__":
    main()
