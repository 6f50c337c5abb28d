"""UsageRow: what one finished request used, as the ledger keeps it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

# how a request ended
OUTCOMES = ("ok", "failed", "cancelled", "refused")

# the figures a row adds up (in every ``group_by`` answer, summed)
SUMMED = ("prompt_tokens", "completion_tokens", "cached_tokens", "images", "steps",
          "audio_seconds", "gpu_seconds", "vram_mb_seconds", "load_seconds", "queue_wait_s",
          "duration_s")


@dataclass(slots=True)
class UsageRow:
    """One finished request. ``key`` is the key's name ("" with no keys configured),
    ``end_user`` the client id the request gave ("" when none). ``gpu_seconds`` is the
    request's share of its slot's busy time (the slot's time divided among the requests it
    served at once, plus the load it caused), ``vram_mb_seconds`` that share times the
    slot's lease."""

    key: str
    end_user: str
    model: str
    endpoint: str
    outcome: str  # one of OUTCOMES
    http_status: int
    request_id: str = ""
    member: str = ""  # the cluster member that served it ("" outside a cluster)
    at: float = field(default_factory=time.time)  # when it finished (Unix seconds)
    queue_wait_s: float = 0.0
    duration_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    images: int = 0
    steps: int = 0
    audio_seconds: float = 0.0
    gpu_seconds: float = 0.0
    vram_mb_seconds: float = 0.0
    load_seconds: float = 0.0

    @property
    def tokens(self) -> int:
        """Tokens in and out: what a ``tokens_per_*`` limit counts."""
        return self.prompt_tokens + self.completion_tokens
