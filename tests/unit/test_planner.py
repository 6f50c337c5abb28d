"""The planner, table-driven: one demand over one snapshot gives Fit, Evict, Wait or Never."""

from __future__ import annotations

import pytest

from model_boss.gpu.placement import LayerCosts
from model_boss.scheduling.eviction import SlotView
from model_boss.scheduling.planner import Demand, Evict, Fit, Never, Snapshot, Wait, plan
from model_boss.slot_key import slot_key

NOW = 1000.0
CEILING = {0: 3584}  # one 4096 MB GPU minus a 512 MB margin


def view(model_id, *, state="ready", pinned=False, active=0, last_used=0.0, priority=5,
         unload_at=NOW + 100, mb=2000, gpu=0):
    return SlotView(model_id, state, pinned, active, last_used, priority, unload_at,
                    {gpu: mb} if mb else {})


def demand(need_mb=2000, priority=5, **kw):
    return Demand("new", need_mb, priority, **kw)


def snap(free, slots=(), ceiling=None):
    return Snapshot(free, ceiling or CEILING, tuple(slots), NOW)


@pytest.mark.parametrize("case, need, prio, free, slots, expected", [
    ("fits on the free GPU", 2000, 5, {0: 3584}, [], Fit),
    ("idle equal-priority model makes room", 2000, 5, {0: 1584}, [view("a")], Evict),
    ("expired important model makes room", 2000, 9, {0: 1584},
     [view("a", priority=0, unload_at=NOW - 1)], Evict),
    ("important idle model inside stay-warm: wait", 2000, 9, {0: 1584},
     [view("a", priority=0)], Wait),
    ("busy model: wait until it is idle", 2000, 5, {0: 1584}, [view("a", active=1)], Wait),
    ("loading model holds its lease: wait", 2000, 5, {0: 1584},
     [view("a", state="loading")], Wait),
    ("draining / offloading models are not victims twice", 2000, 5, {0: 1584},
     [view("a", state="draining"), view("b", state="offloading", mb=0)], Wait),
    ("pinned model leaves too little, ever", 2000, 0, {0: 1584}, [view("a", pinned=True)],
     Never),
    ("bigger than the GPU", 5000, 0, {0: 3584}, [], Never),
    ("offloaded model holds no VRAM: nothing to gain", 2000, 5, {0: 1584},
     [view("o", state="offloaded", mb=0), view("a", active=1)], Wait),
])
def test_plan_kinds(case, need, prio, free, slots, expected):
    assert type(plan(demand(need, prio), snap(free, slots))) is expected, case


def test_evict_names_the_best_victims_first_and_the_placement_after():
    slots = [view("important", priority=1, mb=1000, last_used=5),
             view("batch", priority=9, mb=1000, last_used=9),
             view("old", priority=5, mb=1000, last_used=1)]
    decision = plan(demand(2500, priority=1), snap({0: 584}, slots))
    assert isinstance(decision, Evict)
    assert decision.victims == ("batch", "old")
    assert decision.placement.allocations == {0: 2500}


def test_the_model_itself_is_never_its_own_victim():
    decision = plan(Demand("a", 2000, 5), snap({0: 1584}, [view("a")]))
    assert isinstance(decision, Wait)


def test_no_vram_needed_fits_without_placement():
    assert plan(demand(needs_vram=False), snap({0: 0})) == Fit(None)


def test_split_across_gpus_when_allowed():
    free = {0: 1500, 1: 1500}
    ceiling = {0: 3584, 1: 3584}
    assert isinstance(plan(demand(2500), snap(free, ceiling=ceiling)), Wait)
    decision = plan(demand(2500, allow_split=True), snap(free, ceiling=ceiling))
    assert isinstance(decision, Fit) and decision.placement.kind == "split"


def test_partial_offload_fits_some_layers():
    layers = LayerCosts(per_layer_mb=100, fixed_mb=200, total_layers=30)
    decision = plan(demand(3200, layers=layers), snap({0: 1200}))
    assert isinstance(decision, Fit) and decision.placement.gpu_layers == 10


def test_wait_names_the_models_that_block():
    decision = plan(demand(2000), snap({0: 1584}, [view("busy", active=1),
                                                  view("pin", pinned=True, mb=100)]))
    assert isinstance(decision, Wait) and decision.blocking == ("busy",)
    assert decision.retry_after_s > 0


def test_never_says_how_much_can_ever_be_free():
    decision = plan(demand(3000), snap({0: 584}, [view("pin", pinned=True, mb=1000)]))
    assert isinstance(decision, Never) and "GPU 0: 2584 MB" in decision.reason


@pytest.mark.parametrize("case, aged, slots, wanted, expected", [
    ("an aged request may evict what a more important client left idle", -1,
     [view("a", priority=0)], (), ("a",)),
    ("a fresh one may not", 9, [view("a", priority=0)], (), None),
    ("look-ahead: spare the model the next waiter needs", 5,
     [view("next", mb=1000, last_used=1), view("spare", mb=1000, last_used=9)], ("next",),
     ("spare",)),
    ("look-ahead yields when no other victim exists", 5, [view("next", mb=1000)], ("next",),
     ("next",)),
    ("look-ahead spares every copy of the model the next waiter needs", 5,
     [view(slot_key("next", 2), mb=1000, last_used=1), view("spare", mb=1000, last_used=9)],
     ("next",), ("spare",)),
])
def test_aged_priority_and_look_ahead(case, aged, slots, wanted, expected):
    snapshot = Snapshot({0: 1584}, CEILING, tuple(slots), NOW, wanted)
    decision = plan(demand(2000, priority=aged), snapshot)
    if expected is None:
        assert isinstance(decision, Wait) and decision.blocking == (), case
    else:
        assert isinstance(decision, Evict) and decision.victims == expected, case


def test_wait_drains_only_models_that_will_be_victims():
    slots = [view("busy-peer", active=1, priority=5), view("busy-vip", active=1, priority=0),
             view("idle-vip", priority=0)]
    decision = plan(demand(2000, priority=5), snap({0: 0}, slots))
    assert isinstance(decision, Wait) and decision.blocking == ("busy-peer",)


# two copies of one model: "m" (its first) and "m#2". A decision names the copy it means;
# one copy standing in for the other (or the model for a copy) picks the wrong slot to stop
M, M2 = slot_key("m"), slot_key("m", 2)


@pytest.mark.parametrize("case, loads, siblings, need, slots, expected, named", [
    ("a third model evicts the idle second copy, not the busy first", "new", (), 2000,
     [view(M, active=1, mb=1000), view(M2, mb=1000)], Evict, ("m#2",)),
    ("a third model evicts the idle first copy, not the busy second", "new", (), 2000,
     [view(M, mb=1000), view(M2, active=1, mb=1000)], Evict, ("m",)),
    ("of two idle copies, the least recently used goes", "new", (), 2000,
     [view(M, mb=1000, last_used=9), view(M2, mb=1000, last_used=1)], Evict, ("m#2",)),
    ("room for both: each copy named once, by its own key", "new", (), 3000,
     [view(M, mb=1000, last_used=5), view(M2, mb=1000, last_used=1)], Evict, ("m#2", "m")),
    ("the busy second copy blocks, the important idle first does not", "new", (), 2000,
     [view(M, priority=0, mb=1000), view(M2, active=1, mb=1000)], Wait, ("m#2",)),
    ("loading the second copy never evicts the first, though it was used least", M2, (M,),
     2000, [view(M, mb=1000, last_used=0), view(M2, state="loading", mb=0),
            view("other", mb=1000, last_used=9)], Evict, ("other",)),
    ("reloading the first copy never evicts the second", M, (M2,), 2000,
     [view(M, state="loading", mb=0), view(M2, mb=1000, last_used=0),
      view("other", mb=1000, last_used=9)], Evict, ("other",)),
    ("a copy is never its own victim", M2, (), 2000, [view(M2, mb=1000)], Wait, ()),
])
def test_a_decision_names_the_copy_not_its_model(case, loads, siblings, need, slots,
                                                 expected, named):
    wanted = Demand(slot_key(loads), need, 5, siblings=frozenset(siblings))
    decision = plan(wanted, snap({0: 1584}, slots))
    assert type(decision) is expected, case
    assert (decision.victims if isinstance(decision, Evict) else decision.blocking) == named, \
        case


@pytest.mark.parametrize("case, loads, siblings, waiting, expected", [
    ("a third model spares both copies of a model with waiters", "new", (), ("m",),
     ("spare",)),
    ("a second copy of a model with waiters evicts another model, never its sibling", M2,
     (M,), ("m",), ("spare",)),
    ("... even one the next waiter needs, when it is the only other victim", M2, (M,),
     ("m", "spare"), ("spare",)),
])
def test_look_ahead_over_copies(case, loads, siblings, waiting, expected):
    slots = [view(M, mb=1000, last_used=0),
             view(M2, mb=1000, last_used=1) if loads != M2 else view(M2, state="loading", mb=0),
             view("spare", mb=1000, last_used=9)]
    snapshot = Snapshot({0: 1584}, CEILING, tuple(slots), NOW, waiting)
    decision = plan(Demand(slot_key(loads), 2000, 5, siblings=frozenset(siblings)), snapshot)
    assert isinstance(decision, Evict) and decision.victims == expected, case
