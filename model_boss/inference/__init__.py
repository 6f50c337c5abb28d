"""Running models: backends, slots, the pool and the queue."""

from .backend import HttpWorkerBackend, InferenceBackend, UpstreamResponse
from .owner import SlotOwner
from .planner import Evict, Fit, Never, Plan, Wait
from .pool import ModelPool
from .queue import InferenceQueue, QueuedRequest, SlotTicket
from .slot import TRANSITIONS, IllegalTransition, ModelSlot, SlotState

__all__ = [
    "TRANSITIONS",
    "Evict",
    "Fit",
    "HttpWorkerBackend",
    "IllegalTransition",
    "InferenceBackend",
    "InferenceQueue",
    "ModelPool",
    "ModelSlot",
    "Never",
    "Plan",
    "QueuedRequest",
    "SlotOwner",
    "SlotState",
    "SlotTicket",
    "UpstreamResponse",
    "Wait",
]
