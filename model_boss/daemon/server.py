"""The uvicorn server ``model-boss serve`` runs: uvicorn's, with its own signal handling.

uvicorn's first SIGTERM or SIGINT would close the listener and wait for the open requests up
to ``timeout_graceful_shutdown``, then cancel them mid-answer (a stream cut with no end, a
traceback in the log). Here the first signal starts the coordinator's drain
(:class:`~model_boss.slots.drain.Drain`: new requests refused, running ones given
``shutdown_grace_s``, then cut with their API's end); once it is done uvicorn shuts down
with nothing left to wait for, and the coordinator stops (prompt caches saved, workers
stopped, leases released). A second signal cuts the drain short and skips the saves; the
workers are still stopped and the leases released. Signals while the daemon is still starting
take effect once it has started (one drains, two stop at once), so a stop always runs.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType

import uvicorn

from ..slots.drain import Drain

log = logging.getLogger(__name__)

# uvicorn's own bound on the connections left once the drain is done: a last resort only
LAST_RESORT_S = 5


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose signals drive ``drain`` (see the module's docstring)."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Task | None = None
        self._signals: list[str] = []  # received while starting

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        for name in self._signals if self.started else ():
            self._signalled(name)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """The signal handler (it runs between two bytecodes of the loop's thread): the work
        is done by the loop, in its next turn."""
        name = signal.Signals(sig).name
        loop = self._loop
        if loop is None or not self.started:
            self._signals.append(name)  # taken once started (uvicorn's own way would skip
            return  # the lifespan's shutdown: the coordinator's stop)
        loop.call_soon_threadsafe(self._signalled, name)

    def _signalled(self, name: str) -> None:
        if self._draining is None:
            log.info("%s: stopping (a second SIGTERM or SIGINT stops at once)", name)
            self._draining = asyncio.get_running_loop().create_task(self._drain_then_exit(),
                                                                    name="drain")
        else:
            log.warning("%s again: stopping at once", name)
            self.drain.force()

    async def _drain_then_exit(self) -> None:
        try:
            await self.drain.run()
        except Exception:
            log.exception("draining failed; stopping all the same")
        finally:
            self.should_exit = True


def serve(app: object, drain: Drain, *, host: str, port: int, log_level: int | str) -> int:
    """Serve ``app`` until a signal has drained it; 0 once stopped, 3 (uvicorn's) when it
    could not start."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,  # type: ignore[arg-type]
                            timeout_graceful_shutdown=LAST_RESORT_S)
    server = DrainingServer(config, drain)
    try:
        server.run()
    except KeyboardInterrupt:  # a SIGINT before uvicorn took the signals
        pass
    return 0 if server.started else 3
