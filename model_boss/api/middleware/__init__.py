"""The ASGI middleware every request passes, outermost first: arrivals taking turns with the
work already running (:mod:`.pacing`), CORS (:mod:`.cors`), error
answers in the route's own envelope (:mod:`.envelopes`), the last-resort 500, the Host and
Origin checks (:mod:`.hosts`), API keys with request metrics (:mod:`.auth`, keys in
:mod:`.keys`), the queue's early refusals
(:mod:`.queue_gate`), body limits (:mod:`.limits`) and
the early forward of a cluster member's requests (:mod:`.early_forward`); innermost, the
queued POST routes taken by their path without FastAPI's router (:mod:`.direct_routes`)."""

from .auth import AuthAndMetrics, InternalErrors
from .cors import with_cors
from .direct_routes import take_direct_routes
from .early_forward import EarlyForwarding
from .envelopes import ErrorEnvelope
from .hosts import HostGuard
from .limits import BodyLimit
from .pacing import Pacing
from .queue_gate import QueueGate

__all__ = ["AuthAndMetrics", "BodyLimit", "EarlyForwarding", "ErrorEnvelope", "HostGuard",
           "InternalErrors", "Pacing", "QueueGate", "take_direct_routes", "with_cors"]
