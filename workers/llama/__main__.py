"""``python -m workers.llama --model FILE --port N ...``: see ``options`` for the flags."""

from __future__ import annotations

import os
import sys
import threading

from .lifetime import block_stop_signals, die_with_parent, wait_for_stop
from .options import parse_args, to_params


def main(argv: list[str] | None = None) -> None:
    """Parent-death safety first; load and serve in a thread (llama.cpp's server answers once
    the model is in); exit 0 on SIGTERM, 1 when the load fails."""
    options = parse_args(argv)
    if options.fit_only:
        from .fit import project

        project(options)
    die_with_parent(options.parent_pid)
    block_stop_signals()
    failed = threading.Event()
    held: list[object] = []  # the server lives as long as the process

    def load() -> None:
        import xllamacpp

        try:
            held.append(xllamacpp.Server(to_params(options)))
        except BaseException as exc:
            print(f"llama.cpp server failed: {exc}", file=sys.stderr, flush=True)
            failed.set()

    threading.Thread(target=load, name="llama-server", daemon=True).start()
    reason = wait_for_stop(failed)
    print(f"workers.llama: stopping ({reason})", file=sys.stderr, flush=True)
    # skip interpreter teardown: the server's threads end with the process
    os._exit(1 if failed.is_set() else 0)


if __name__ == "__main__":
    main()
