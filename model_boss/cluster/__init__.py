"""Several coordinators sharing one Redis behave as one service (docs/CLUSTER.md).

Membership with heartbeats, a slot registry, routing to where a model is warm or fits best,
load locks, forwarding between members, and jobs on a Redis Stream.
"""

from typing import TYPE_CHECKING

from .choice import Choice, Here, There, choose_member
from .forward import (
    FORWARDED_HEADER,
    MEMBER_HEADER,
    SECRET_HEADER,
    MemberUnreachable,
    forward_refusal,
)
from .records import MemberRecord, SlotRecord

if TYPE_CHECKING:
    from .cluster import Cluster, Route
    from .store import ClusterStore

# What talks to Redis loads on first use: a coordinator without a cluster never imports
# the Redis client (a third of a second of every start).
_LAZY = {"Cluster": ".cluster", "Route": ".cluster", "ClusterStore": ".store"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FORWARDED_HEADER",
    "MEMBER_HEADER",
    "SECRET_HEADER",
    "Choice",
    "Cluster",
    "ClusterStore",
    "Here",
    "MemberRecord",
    "MemberUnreachable",
    "Route",
    "SlotRecord",
    "There",
    "choose_member",
    "forward_refusal",
]
