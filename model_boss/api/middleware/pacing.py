"""Arrivals take turns with the work already running.

The event loop runs, in each of its turns, everything that became ready in the one before. A
burst of a thousand requests makes one turn hold hundreds of arrivals (each read, parsed,
routed and queued: about a millisecond), and whatever the requests already running need next
(an answer to relay, a freed slot to hand on, the next request to send upstream) waits behind
all of them, once for each step it takes. So while requests wait in the queue, at most
``per_turn`` requests start in one turn; the rest wait, in arrival order, for the next ones.
With nothing queued nothing is paced (nothing running waits behind the arrivals for long),
and the first ``per_turn`` of a turn always go straight through.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

PER_TURN = 4


class Pacing:
    """Outermost of the coordinator's middleware: while ``busy()`` (requests wait in the
    queue), at most ``per_turn`` HTTP requests begin per turn of the loop, the others wait in
    a first-come line (one future each)."""

    def __init__(self, app: ASGIApp, per_turn: int = PER_TURN,
                 busy: Callable[[], bool] = lambda: True) -> None:
        self.app = app
        self.per_turn = per_turn
        self.busy = busy
        self._started = 0  # begun in this turn
        self._line: deque[asyncio.Future[None]] = deque()
        self._turn_ends = False  # a callback that opens the next turn is scheduled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (self._line or self.busy()):
            if self._line or self._started >= self.per_turn:
                await self._wait_turn()
            else:
                self._started += 1
            self._mark_turn()
        await self.app(scope, receive, send)

    async def _wait_turn(self) -> None:
        ready = asyncio.get_running_loop().create_future()
        self._line.append(ready)
        try:
            await ready
        except asyncio.CancelledError:
            if not ready.done():
                ready.cancel()  # left in the line, skipped when its turn comes
            raise

    def _mark_turn(self) -> None:
        if not self._turn_ends:
            self._turn_ends = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """The loop's next turn: the next ``per_turn`` in line may begin."""
        self._turn_ends = False
        self._started = 0
        while self._line and self._started < self.per_turn:
            ready = self._line.popleft()
            if not ready.done():
                ready.set_result(None)
                self._started += 1
        if self._line:
            self._mark_turn()
