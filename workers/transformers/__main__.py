"""``python -m workers.transformers --model DIR --task embedding|rerank|stt|tts --port N ...``
(or ``--spare``): see ``options`` for the flags."""

from __future__ import annotations

import logging
import os

from ..process import collector_paused, die_with_parent, serve
from .app import create_app
from .engine import Engine, preimport
from .options import parse_args


def main(argv: list[str] | None = None) -> None:
    """Parent-death safety first, then serve until SIGTERM or ``POST /shutdown``."""
    options = parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    die_with_parent(options.parent_pid)
    if options.spare:
        with collector_paused(freeze=True):
            preimport()  # before the port opens: a spare that answers has paid for its imports
    engine = Engine(options)
    serve(lambda stop: create_app(engine, shutdown=stop, api_key=options.api_key),
          options.host, options.port, on_exit=lambda: None)


if __name__ == "__main__":
    main()
