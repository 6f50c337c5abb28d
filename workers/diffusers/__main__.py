"""``python -m workers.diffusers --model DIR --port N ...``: see ``options`` for the flags."""

from __future__ import annotations

import logging
import os

from ..process import collector_paused, die_with_parent, serve
from .app import create_app
from .generation import Generator
from .loader import LoadedPipeline, load_pipeline, preimport
from .options import WorkerOptions, parse_args
from .pipeline import PipelineHolder


def main(argv: list[str] | None = None) -> None:
    """Parent-death safety first, then serve until SIGTERM or ``POST /shutdown``."""
    options = parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    die_with_parent(options.parent_pid)
    if options.spare:
        with collector_paused(freeze=True):
            preimport()  # before the port opens: a spare that answers has paid for its imports
    holder = PipelineHolder(options)
    generator = Generator(holder)

    def load(opts: WorkerOptions) -> LoadedPipeline:
        with collector_paused():  # torch, diffusers and the pipeline's modules come in
            return load_pipeline(opts, holder.load_progress)

    serve(lambda stop: create_app(holder, generator, load, stop, api_key=options.api_key),
          options.host, options.port, on_exit=generator.cancel)


if __name__ == "__main__":
    main()
