"""MinuteWindows: each key's last minute of admitted requests and used tokens, for the rate
limits (:func:`~.policy.refusal` decides over a reading of them)."""

from __future__ import annotations

from collections import deque

from .policy import MINUTE_S, MinuteReading


class MinuteWindows:
    """Per key: when its requests were let in, and when (and how many) tokens it used, over
    the last minute. Old entries go as each key is read or written."""

    def __init__(self) -> None:
        self._requests: dict[str, deque[float]] = {}
        self._tokens: dict[str, deque[tuple[float, int]]] = {}

    def admitted(self, key: str, now: float) -> None:
        self._requests.setdefault(key, deque()).append(now)

    def used(self, key: str, now: float, tokens: int) -> None:
        if tokens > 0:
            self._tokens.setdefault(key, deque()).append((now, tokens))

    def reading(self, key: str, now: float) -> MinuteReading:
        since = now - MINUTE_S
        requests = self._requests.get(key)
        while requests and requests[0] <= since:
            requests.popleft()
        tokens = self._tokens.get(key)
        while tokens and tokens[0][0] <= since:
            tokens.popleft()
        return MinuteReading(tuple(requests or ()), tuple(tokens or ()))
