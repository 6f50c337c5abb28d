"""SlotState: the states a slot can be in, as the decisions read them and the slots live them.

The vocabulary lives here, beside the decisions that read it (the planner's views, eviction,
the queue); the one transition table and the slot that follows it live in
:mod:`model_boss.slots.slot`.
"""

from __future__ import annotations

from enum import StrEnum


class SlotState(StrEnum):
    IDLE = "idle"            # no worker, no lease (disk tier)
    LOADING = "loading"      # lease held, worker starting (or onloading from the CPU tier)
    READY = "ready"          # lease held, worker alive: the only state requests are granted in
    DRAINING = "draining"    # about to offload or stop: no new grants, running ones finish
    OFFLOADING = "offloading"  # weights moving to CPU RAM
    OFFLOADED = "offloaded"  # worker alive, weights in CPU RAM, no lease (CPU tier)
    STOPPING = "stopping"    # worker being stopped
