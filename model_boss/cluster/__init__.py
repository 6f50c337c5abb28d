"""Several coordinators sharing one Redis behave as one service (docs/CLUSTER.md).

Membership with heartbeats, a slot registry, routing to where a model is warm or fits best,
load locks, forwarding between members, and jobs on a Redis Stream.
"""

from .choice import Choice, Here, There, choose_member
from .cluster import Cluster, Route
from .forward import (
    FORWARDED_HEADER,
    MEMBER_HEADER,
    SECRET_HEADER,
    MemberUnreachable,
    forward_refusal,
)
from .records import MemberRecord, SlotRecord
from .store import ClusterStore

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
