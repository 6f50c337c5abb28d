"""The daemon's drain: what a stop (SIGTERM, SIGINT) does before the workers are stopped.

From :meth:`Drain.run` on, every new request is refused (:class:`ShuttingDown`, 503 with
``Retry-After``); the requests already running get ``shutdown_grace_s`` to finish; a cluster
member hands the requests still waiting in its queue to another member (the services
register them in :attr:`Drain.handable`); whatever still runs after the grace, or at once
after :meth:`Drain.force` (a second signal), is cut: its task is cancelled and the HTTP edge
ends its answer in its API's own shape. Then the coordinator's stop runs as before (prompt
caches saved, workers stopped, leases released).

The HTTP edge registers each request (:meth:`enter` / :meth:`leave`); nothing here knows
HTTP. Requests that only read (``work`` False: a GET, an event stream) are not waited for;
they are cut with the rest once the work is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..errors import ModelBossError

log = logging.getLogger(__name__)

SHUTTING_DOWN = "shutting_down"
# how long the requests cut get to send their last bytes (closing a worker's stream among
# them); one still running then is left to uvicorn's own bound
CUT_WAIT_S = 5.0
# one hook of the drain's start (a cluster member leaving the view) may take this long
HOOK_S = 5.0


class ShuttingDown(ModelBossError):
    """The daemon is stopping: a new request is refused, a running one past the grace is
    cut. Another member, or this one once it is back, will take the request."""

    status_code = 503
    error_type = "server_error"
    code = SHUTTING_DOWN


@dataclass(eq=False, slots=True)
class InFlight:
    """One request the HTTP edge is serving: its task, whether the drain waits for it, and
    whether the drain cut it (cancelled its task, once)."""

    task: asyncio.Task
    work: bool
    cut: bool = False


class Drain:
    """One per coordinator: the state of its stop, as every request path sees it."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.since: float | None = None  # the wall clock when the drain began
        self.forced = False
        self.requests: set[InFlight] = set()
        # requests that another member may serve instead: task -> "hand it off now?" (True
        # when it has not started; the services then forward it, or refuse a forward)
        self.handable: dict[asyncio.Task, Callable[[], bool]] = {}
        self.handed: set[asyncio.Task] = set()
        self.on_begin: list[Callable[[], Awaitable[None]]] = []  # a member leaves the view
        self.on_force: list[Callable[[], None]] = []  # prompt caches stop being saved
        self._changed = asyncio.Event()

    @property
    def draining(self) -> bool:
        return self.since is not None

    def refusal(self) -> ShuttingDown:
        return ShuttingDown("model-boss is shutting down and takes no new requests; "
                            "retry on another instance or once it is back")

    def enter(self, task: asyncio.Task, *, work: bool) -> InFlight:
        request = InFlight(task, work)
        self.requests.add(request)
        return request

    def leave(self, request: InFlight) -> None:
        self.requests.discard(request)
        self._changed.set()

    def running(self) -> int:
        """The requests the drain waits for."""
        return sum(1 for r in self.requests if r.work)

    def force(self) -> None:
        """A second signal: cut what runs now; what the stop does after skips what may wait
        (prompt cache saves)."""
        first = not self.forced
        self.forced = True
        if first:
            for hook in self.on_force:
                try:
                    hook()
                except Exception as exc:  # a hook's failure never keeps the daemon up
                    log.warning("stopping at once: %s failed: %s", hook, exc)
        self._changed.set()

    async def run(self) -> None:
        """Refuse, hand off, wait for the work within the grace, cut what is left. Returns
        once no request is left (or the cut requests had ``CUT_WAIT_S`` to end)."""
        if self.since is not None:
            return
        self.since = time.time()
        started = time.monotonic()
        log.info("stopping: new requests are refused (503 shutting_down); %d running get "
                 "up to %gs to finish (shutdown_grace_s)", self.running(), self.grace_s)
        for hook in self.on_begin:
            await _bounded(hook)
        self._hand_off()
        deadline = started + self.grace_s
        while not self.forced and self.running():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._changed.wait()
        waited = time.monotonic() - started
        cut = self._cut()
        until = time.monotonic() + CUT_WAIT_S
        while self.requests and time.monotonic() < until:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(until - time.monotonic()):
                    await self._changed.wait()
        if self.requests:
            log.warning("stopping: %d request(s) still running %gs after being cut",
                        len(self.requests), CUT_WAIT_S)
        log.info("stopping: drained after %.1fs%s", waited,
                 f"; {cut} request(s) cut" if cut else "; every request finished")

    def _hand_off(self) -> None:
        for task, may in list(self.handable.items()):
            try:
                if not may():
                    continue
            except Exception as exc:
                log.warning("stopping: a queued request could not be handed off: %s", exc)
                continue
            self.handed.add(task)
            task.cancel()

    def _cut(self) -> int:
        """Cancel every request's task, once (a second cancel would land in the clean-up
        of the first: the edge could not tell it from the server's own)."""
        cut = 0
        for request in list(self.requests):
            if request.cut or request.task.done():
                continue
            request.cut = True
            request.task.cancel()
            cut += 1
        return cut


async def _bounded(hook: Callable[[], Awaitable[None]]) -> None:
    """A hook of the drain's start: a failure or a hang is logged, and the drain goes on."""
    try:
        async with asyncio.timeout(HOOK_S):
            await hook()
    except TimeoutError:
        log.warning("stopping: %s took over %gs; went on without it", hook, HOOK_S)
    except Exception as exc:
        log.warning("stopping: %s failed: %s", hook, exc)
