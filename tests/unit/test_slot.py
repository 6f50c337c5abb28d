"""The slot lifecycle: one transition table, legal and illegal moves."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from model_boss.catalog import Catalog, ModelManifest
from model_boss.events import EventBus
from model_boss.slots.slot import TRANSITIONS, IllegalTransition, ModelSlot, SlotState

S = SlotState
LEGAL = {
    (S.IDLE, S.LOADING),
    (S.LOADING, S.READY), (S.LOADING, S.IDLE), (S.LOADING, S.STOPPING),
    (S.READY, S.DRAINING), (S.READY, S.OFFLOADING), (S.READY, S.STOPPING), (S.READY, S.IDLE),
    (S.DRAINING, S.READY), (S.DRAINING, S.OFFLOADING), (S.DRAINING, S.STOPPING),
    (S.DRAINING, S.IDLE),
    (S.OFFLOADING, S.OFFLOADED), (S.OFFLOADING, S.STOPPING), (S.OFFLOADING, S.IDLE),
    (S.OFFLOADED, S.LOADING), (S.OFFLOADED, S.STOPPING), (S.OFFLOADED, S.IDLE),
    (S.STOPPING, S.IDLE),
}


def make_slot(state: SlotState) -> ModelSlot:
    manifest = ModelManifest(id="m", path="m.gguf")
    entry = Catalog([manifest], Path("/tmp")).get("m")
    slot = ModelSlot(entry=entry, events=EventBus())
    slot.state = state
    return slot


def test_table_matches_the_documented_lifecycle():
    table = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    assert table == LEGAL


@pytest.mark.parametrize("old, new", sorted(itertools.product(S, S)))
def test_every_pair(old, new):
    slot = make_slot(old)
    if (old, new) in LEGAL:
        slot.transition(new, "test")
        assert slot.state == new
        event = slot.events.recent("slot_state")[-1]
        assert (event["old"], event["new"]) == (str(old), str(new))
    else:
        with pytest.raises(IllegalTransition):
            slot.transition(new)
        assert slot.state == old
        assert slot.events.recent("slot_state") == []


def test_unload_at_follows_stay_warm_and_pin():
    slot = make_slot(S.READY)
    slot.stay_warm_s = 10
    slot.touch(priority=3, now=100.0)
    assert slot.unload_at == 110.0 and slot.last_priority == 3
    assert not slot.expired(109.0) and slot.expired(110.0)
    slot.active = 1
    assert not slot.expired(200.0)
    slot.active = 0
    slot.pinned = True
    slot.refresh_unload_at(100.0)
    assert slot.unload_at is None and not slot.expired(1e12)
    slot.pinned = False
    slot.stay_warm_s = -1
    slot.refresh_unload_at(100.0)
    assert slot.unload_at is None
