"""Replicas: when a model gets another copy and how a request picks among its copies."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ReplicaSettings(BaseModel):
    """Scaling out and routing among a model's copies (docs/SCHEDULING.md#replicas)."""

    # a model whose first waiter waited this long gets one more copy where a GPU has room; a
    # request goes to the replica holding its prompt's prefix unless that one runs more than
    # replica_load_slack requests beyond the least loaded one
    replica_scale_wait_s: float = Field(default=2.0, ge=0)
    replica_load_slack: int = Field(default=2, ge=0)
    replica_routing: Literal["cache", "least_loaded", "round_robin"] = "cache"
