"""Slots: what runs where. A model's slot, its one owner (the only writer of its state, lease
and worker), a load as that owner's operation, load progress, the pool of owners with its room
making, and the CPU-RAM tier. Everything here acts; what to do comes from
:mod:`model_boss.scheduling`, how a worker runs from :mod:`model_boss.backends`."""

from .owner import SlotOwner
from .pool import ModelPool
from .slot import TRANSITIONS, IllegalTransition, ModelSlot, SlotState

__all__ = ["TRANSITIONS", "IllegalTransition", "ModelPool", "ModelSlot", "SlotOwner",
           "SlotState"]
