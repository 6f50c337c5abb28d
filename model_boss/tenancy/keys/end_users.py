"""EndUserAdmission: the rates and day's tokens a key's ``end_user_limits`` set on each end
user under it, checked once the request says who its end user is (its ``X-Client-Id``,
``user`` or ``metadata.user_id``), before it is queued. The decision is the key's own
(:func:`~.policy.refusal`) over the end user's minute and day."""

from __future__ import annotations

import time
from typing import Protocol

from ...errors import ModelBossError
from ...settings import ClientProfile, EndUserLimits
from ..usage.periods import day_start
from ..usage.totals import Spent
from .policy import refusal
from .windows import MinuteWindows


class EndUserSpentReader(Protocol):
    """What an end user of a key spent since a time (the usage ledger's
    ``end_user_spent``)."""

    def __call__(self, key: str, end_user: str, since: float) -> Spent: ...


class EndUserAdmission:
    """Each end user's last minute (requests let in, tokens used) and, through ``spent``,
    its day. An end user is a label under a key: the key's own limits still apply to all of
    them together, at the door."""

    def __init__(self, spent: EndUserSpentReader) -> None:
        self.windows = MinuteWindows()
        self.spent = spent

    def admit(self, key: str, end_user: str, limits: EndUserLimits | None,
              now: float | None = None) -> ModelBossError | None:
        """The 429 for one more request of ``end_user`` under ``key`` (its Retry-After when
        it could start), else None and the request is counted. A request that names no end
        user is the key's alone: only the key's limits bound it."""
        if not end_user or limits is None or not limits.rated:
            return None
        now = time.time() if now is None else now
        window = (key, end_user)
        profile = ClientProfile(requests_per_minute=limits.requests_per_minute,
                                tokens_per_minute=limits.tokens_per_minute,
                                tokens_per_day=limits.tokens_per_day)
        refused = refusal(key, profile, now=now, minute=self.windows.reading(window, now),
                          day=self.spent(key, end_user, day_start(now)), month=Spent(),
                          holder=f"end user '{end_user}' of key '{key}'")
        if refused is None:
            self.windows.admitted(window, now)
        return refused

    def used(self, key: str, end_user: str, at: float, tokens: int) -> None:
        """A finished request's tokens, into its end user's minute."""
        if key and end_user:
            self.windows.used((key, end_user), at, tokens)
