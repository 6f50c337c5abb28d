"""Running models: backends, slots, the pool and the queue."""

from .backend import HttpWorkerBackend, InferenceBackend, UpstreamResponse
from .pool import Admission, ModelPool
from .queue import InferenceQueue, QueuedRequest, SlotTicket
from .slot import TRANSITIONS, IllegalTransition, ModelSlot, SlotState

__all__ = [
    "TRANSITIONS",
    "Admission",
    "HttpWorkerBackend",
    "IllegalTransition",
    "InferenceBackend",
    "InferenceQueue",
    "ModelPool",
    "ModelSlot",
    "QueuedRequest",
    "SlotState",
    "SlotTicket",
    "UpstreamResponse",
]
