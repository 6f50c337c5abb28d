"""The waiting line: priorities, aging, fair shares, queue bounds and cloud fallback."""

from __future__ import annotations

from pydantic import BaseModel, Field


class QueueSettings(BaseModel):
    """How requests wait and in which order they are served (docs/SCHEDULING.md)."""

    default_priority: int = Field(default=5, ge=0, le=100)
    max_queue_wait_s: float = Field(default=300.0, gt=0)
    # a stream that has waited this long on its model's load starts with SSE comment lines
    load_comments_after_s: float = Field(default=1.0, ge=0)
    max_queue_depth: int = Field(default=1000, ge=1)
    max_queued_per_client: int = Field(default=200, ge=1)
    aging_s: float = Field(default=2.0, ge=0)  # waiting this long = one priority level
    fair_share: bool = True
    fair_share_turn_s: float = Field(default=2.0, gt=0)  # due-time cost of one turn
    request_rate_horizon_s: float = Field(default=120.0, gt=0)
    # seed of the runtime toggle: a task's cloud candidates may stand in for local ones
    allow_cloud_fallback: bool = True
