"""``python -m workers.llama --model FILE --port N ...``: see ``options`` for the flags."""

from __future__ import annotations

import os
import sys
import threading

from .lifetime import die_with_parent, stop_event
from .options import parse_args, to_params


def main(argv: list[str] | None = None) -> None:
    """Parent-death safety first; load and serve in a thread (llama.cpp's server answers once
    the model is in); exit 0 on SIGTERM, 1 when the load fails."""
    options = parse_args(argv)
    die_with_parent(options.parent_pid)
    stop = stop_event()
    failure: list[BaseException] = []
    held: list[object] = []  # the server lives as long as the process

    def load() -> None:
        import xllamacpp

        try:
            held.append(xllamacpp.Server(to_params(options)))
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)
            stop.set()

    threading.Thread(target=load, name="llama-server", daemon=True).start()
    stop.wait()
    if failure:
        print(f"llama.cpp server failed: {failure[0]}", file=sys.stderr, flush=True)
    sys.stderr.flush()
    # skip interpreter teardown: the server's threads end with the process
    os._exit(1 if failure else 0)


if __name__ == "__main__":
    main()
