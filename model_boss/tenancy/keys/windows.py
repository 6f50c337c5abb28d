"""MinuteWindows: each key's (and each end user's under a key) last minute of admitted
requests and used tokens, for the rate limits (:func:`~.policy.refusal` decides over a
reading of them)."""

from __future__ import annotations

from collections import deque

from .policy import MINUTE_S, MinuteReading

# whose minute: a key's name, or (key, end user) for an end user under it
WindowName = str | tuple[str, str]


class MinuteWindows:
    """Per key: when its requests were let in, and when (and how many) tokens it used, over
    the last minute, and the sum of those tokens. Old entries go as each key is read.

    A reading hands over the windows' own deques, not copies (a copy per request costs what
    the minute holds: 60,000 entries at a thousand requests a second); the decision over it
    is taken at once, on the loop, before anything else changes them."""

    def __init__(self) -> None:
        self._requests: dict[WindowName, deque[float]] = {}
        self._tokens: dict[WindowName, deque[tuple[float, int]]] = {}
        self._token_sums: dict[WindowName, int] = {}

    def admitted(self, key: WindowName, now: float) -> None:
        self._requests.setdefault(key, deque()).append(now)

    def used(self, key: WindowName, now: float, tokens: int) -> None:
        if tokens > 0:
            self._tokens.setdefault(key, deque()).append((now, tokens))
            self._token_sums[key] = self._token_sums.get(key, 0) + tokens

    def reading(self, key: WindowName, now: float) -> MinuteReading:
        since = now - MINUTE_S
        requests = self._requests.get(key)
        while requests and requests[0] <= since:
            requests.popleft()
        tokens = self._tokens.get(key)
        if tokens is None:
            return MinuteReading(requests or (), (), 0)
        total = self._token_sums[key]
        while tokens and tokens[0][0] <= since:
            total -= tokens.popleft()[1]
        self._token_sums[key] = total
        return MinuteReading(requests or (), tokens, total)
