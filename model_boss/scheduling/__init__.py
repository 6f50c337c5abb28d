"""Scheduling: the decisions, and the queue that applies them. Ordering (aging, fair share,
warm grouping), the planner (Fit / Evict / Wait / Never), eviction order, budgets, request
rates, learned figures, per-client records, the waiting line as clients see it, the router.

Decisions are pure functions over plain data; the queue and the router reach the slots only
through the small protocols in :mod:`.seams`, so nothing here imports the code that acts."""

from .planner import Evict, Fit, Never, Plan, Wait
from .queue import InferenceQueue
from .request import QueuedRequest, SlotTicket

__all__ = ["Evict", "Fit", "InferenceQueue", "Never", "Plan", "QueuedRequest", "SlotTicket",
           "Wait"]
