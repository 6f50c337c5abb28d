"""The ASGI middleware every request passes, outermost first, one concern each: arrivals
taking turns with the work already running (:mod:`.pacing`), CORS (:mod:`.cors`), error
answers in the route's own envelope (:mod:`.envelopes`), the drain (:mod:`.drain`), the
last-resort 500 (:mod:`.internal_errors`), the Host and Origin checks (:mod:`.hosts`), cluster
members' forwards (:mod:`.forwards`), who the request is (:mod:`.identity`, the key checks
in :mod:`.keys`), the key's rates and quotas (:mod:`.admission`), request metrics
(:mod:`.request_metrics`), the queue's early refusals (:mod:`.queue_gate`), body limits
(:mod:`.limits`) and the early forward of a cluster member's requests
(:mod:`.early_forward`); innermost, the queued POST routes taken by their path without
FastAPI's router (:mod:`.direct_routes`)."""

from .admission import Admission
from .cors import with_cors
from .direct_routes import take_direct_routes
from .early_forward import EarlyForwarding
from .envelopes import ErrorEnvelope
from .forwards import ForwardTrust
from .hosts import HostGuard
from .identity import Identify
from .internal_errors import InternalErrors
from .limits import BodyLimit
from .pacing import Pacing
from .queue_gate import QueueGate
from .request_metrics import RequestMetrics

__all__ = ["Admission", "BodyLimit", "EarlyForwarding", "ErrorEnvelope", "ForwardTrust",
           "HostGuard", "Identify", "InternalErrors", "Pacing", "QueueGate", "RequestMetrics",
           "take_direct_routes", "with_cors"]
