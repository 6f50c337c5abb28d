"""BusyShare: one slot's busy time divided among the requests it served at once."""

from __future__ import annotations


class BusyShare:
    """A per-slot clock that requests enter and leave. A request's share is the integral,
    over the time it ran, of 1 / (requests running at that moment), so the shares of all
    requests add up to the time the slot had at least one request (``busy_s``): a slot
    serving four requests at once charges each a quarter of that stretch.

    Pure and synchronous: the caller passes the time (a monotonic clock) and owns the lock.
    A time earlier than the last one seen counts as the last one (no negative stretches).
    """

    __slots__ = ("_entered", "_last", "_next_token", "_per_request", "busy_s")

    def __init__(self) -> None:
        # time one request present throughout would have been charged since the clock began
        self._per_request = 0.0
        self._last: float | None = None
        self._entered: dict[int, float] = {}  # token -> _per_request when it entered
        self._next_token = 0
        self.busy_s = 0.0  # time with at least one request running

    @property
    def running(self) -> int:
        """Requests in the slot now."""
        return len(self._entered)

    def _advance(self, now: float) -> None:
        if self._last is not None and now > self._last:
            if self._entered:
                stretch = now - self._last
                self._per_request += stretch / len(self._entered)
                self.busy_s += stretch
            self._last = now
        elif self._last is None:
            self._last = now

    def enter(self, now: float) -> int:
        """A request starts running; the token it gets is what it leaves with."""
        self._advance(now)
        token = self._next_token
        self._next_token += 1
        self._entered[token] = self._per_request
        return token

    def leave(self, token: int, now: float) -> float:
        """The request of ``token`` stops; its share of the slot's time, in seconds."""
        self._advance(now)
        try:
            entered = self._entered.pop(token)
        except KeyError:
            raise ValueError(f"token {token} is not in the slot (left twice?)") from None
        return self._per_request - entered
