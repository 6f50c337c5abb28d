"""``model-boss serve``: the daemon started and served until a signal has drained it."""

from __future__ import annotations

import gc
import logging
import sys

from ..errors import ConfigError


def start(config: str | None, *, host: str | None, port: int | None) -> int:
    """``model-boss serve``: settings (``config`` and the flags over them), the app, the
    collector and the log set, then served until a signal has drained it; 2 on a
    configuration error (named on stderr), 3 when the server could not start."""
    # No cyclic collection while the modules, the settings and the app are built: those
    # objects live as long as the daemon, and collecting as they came cost a fifth of the
    # start (1.20 s of CPU against 0.93 s, docs/BENCHMARKS.md); quiet_collector freezes them.
    gc.disable()
    try:
        from ..api.app import create_app
        from ..settings import load_settings
        from .server import serve

        overrides = {}
        if host:
            overrides["host"] = host
        if port:
            overrides["port"] = port
        try:
            settings = load_settings(config, **overrides)
            app = create_app(settings)
        except ConfigError as exc:
            print(f"model-boss: configuration error: {exc.message}", file=sys.stderr)
            return 2
    finally:
        gc.enable()
    quiet_collector()
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if logging.getLogger().level > logging.DEBUG:
        # httpx logs each call it makes at INFO: a loading worker's health, asked every
        # 20 ms, filled the log; those lines show at log_level debug
        logging.getLogger("httpx").setLevel(logging.WARNING)
    # uvicorn's own lines (an access line per request among them) follow log_level too; its
    # signals drain the daemon first (docs/FAULTS.md#stopping)
    return serve(app, app.state.coordinator.drain, host=settings.host, port=settings.port,
                 log_level=logging.getLogger().level)


# Collect the youngest objects every this many allocations (Python's default: 700). A
# request allocates a few hundred tracked objects and thousands may wait at once: with 1,000
# waiting, the default's collections (and the full ones they set off) took 0.4 ms of the
# coordinator's 1.6 ms of CPU per request; frozen and at 5,000, 0.1 ms (docs/BENCHMARKS.md,
# queue_scale.py). 20,000 collects less often but longer, and no cheaper in all.
YOUNG_COLLECTION_EVERY = 5_000


def quiet_collector() -> None:
    """Keep the cyclic garbage collector off the objects that live as long as the daemon
    (modules, the app, settings, schemas: frozen, never scanned again) and run it less often;
    reference counting frees a request's objects either way."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, older, oldest)
