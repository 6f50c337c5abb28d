"""A model's replicas in the pool: the slots past the first (keyed ``id#n``), the demand
that keeps a replica off its siblings' GPUs, and forgetting the ones that went back to disk.
Which replica a request goes to, and when one more is started, is decided in
``scheduling.replicas``; the queue asks."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..scheduling.planner import Demand
from ..slot_key import SlotKey, model_of, slot_key
from .owner import SlotOwner
from .slot import ModelSlot, SlotState

if TYPE_CHECKING:
    from ..catalog import CatalogEntry
    from ..events import EventBus


class Replicas:
    """The replica half of :class:`~.pool.ModelPool` (its slots, owners and claims)."""

    owners: dict[SlotKey, SlotOwner]
    slots: dict[SlotKey, ModelSlot]
    events: EventBus
    _claims: dict[SlotKey, dict[int, int]]

    def owner(self, model_id: str) -> SlotOwner:
        raise NotImplementedError

    def demand(self, entry: CatalogEntry, priority: int) -> Demand:
        raise NotImplementedError

    def replica_demand(self, owner: SlotOwner, priority: int) -> Demand:
        """The demand of loading the owner's copy: a replica stays off the GPUs its siblings
        hold and never evicts one of them."""
        demand = replace(self.demand(owner.slot.entry, priority), key=owner.key)
        siblings = [o for o in self.replicas(owner.model_id) if o is not owner]
        if not siblings:
            return demand
        avoid = {gpu for o in siblings if o.slot.lease for gpu in o.slot.lease.allocations}
        avoid |= {gpu for o in siblings for gpu in self._claims.get(o.key, {})}
        return replace(demand, avoid_gpus=frozenset(avoid),
                       siblings=frozenset(o.key for o in siblings))

    def replicas(self, model_id: str) -> list[SlotOwner]:
        """The model's slot owners: the first replica (keyed by its id), then the others."""
        first_key = slot_key(model_id)
        first = self.owners.get(first_key)
        more = sorted((o for key, o in self.owners.items() if key != first_key
                       and model_of(key) == model_id and o.model_id == model_id),
                      key=lambda o: o.slot.replica)
        return ([first] if first is not None else []) + more

    def add_replica(self, model_id: str) -> SlotOwner:
        """An idle replica of ``model_id`` to load: one already here (the first included),
        else a new slot numbered after the last."""
        found = self.replicas(model_id) or [self.owner(model_id)]
        idle = next((o for o in found if o.slot.state == SlotState.IDLE and not o.busy), None)
        if idle is not None:
            return idle
        first = found[0].slot
        number = max(o.slot.replica for o in found) + 1
        slot = ModelSlot(entry=first.entry, events=self.events, pinned=False, replica=number,
                         stay_warm_s=first.stay_warm_s)
        owner = SlotOwner(slot, self)
        self.slots[slot.key] = slot
        self.owners[slot.key] = owner
        return owner

    def prune_replicas(self) -> None:
        """Forget the replicas past the first that went back to disk (their keep-alive ran
        out, they were evicted, or their worker died)."""
        for key, owner in list(self.owners.items()):
            s = owner.slot
            if s.replica > 1 and s.state == SlotState.IDLE and not owner.busy \
                    and not s.active and not owner.waiters:
                del self.owners[key], self.slots[key]
