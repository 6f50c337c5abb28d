"""What the coordinator did lately, kept in memory for the dashboard: the timeline (VRAM,
queue, rates, marks) sampled every ``history_step_s``, and the last finished requests."""

from .requests import RequestRing
from .timeline import History

__all__ = ["History", "RequestRing"]
