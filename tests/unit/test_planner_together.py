"""A realtime pipeline's models planned together, table-driven: :func:`together` says they can
be resident at once, or names the first that cannot fit beside the others; and a model an
open session holds is evicted only for a request more important than the session."""

from __future__ import annotations

import pytest

from model_boss.scheduling.eviction import SlotView, evict_candidates
from model_boss.scheduling.planner import Demand, Evict, Never, Snapshot, Wait, plan, together

NOW = 1000.0
CEILING = {0: 3584}  # one 4096 MB GPU minus a 512 MB margin


def view(key, mb=1000, *, pinned=False, held=None, priority=5, active=0):
    return SlotView(key, "ready", pinned, active, 0.0, priority, NOW + 100,
                    {0: mb} if mb else {}, held_priority=held)


def pipeline(stt=500, llm=1500, voice=500, priority=5):
    return [Demand("stt", stt, priority), Demand("llm", llm, priority),
            Demand("voice", voice, priority)]


def snap(slots=(), ceiling=None):
    return Snapshot({0: 0}, ceiling or CEILING, tuple(slots), NOW)


@pytest.mark.parametrize("case, demands, slots, refused", [
    ("an empty GPU takes all three", pipeline(), [], None),
    ("idle models of any priority are gone by the time they are needed", pipeline(),
     [view("a", 3000, priority=0)], None),
    ("the members already loaded hold their own room", pipeline(llm=2500),
     [view("llm", 2500), view("stt", 500)], None),
    ("three that fit alone but not together: the last placed is named", pipeline(llm=2600),
     [], "voice"),
    ("a pinned model leaves too little for the biggest", pipeline(),
     [view("p", 2500, pinned=True)], "llm"),
    ("a session as important holds its model: no room", pipeline(),
     [view("x", 2500, held=5)], "llm"),
    ("a session less important does not keep its model from this one", pipeline(priority=2),
     [view("x", 2500, held=5)], None),
    ("a loaded member does not count twice", pipeline(llm=3000, stt=300, voice=200),
     [view("llm", 3000)], None),
    ("bigger than the GPU on its own", pipeline(llm=4000), [], "llm"),
])
def test_together(case, demands, slots, refused):
    answer = together(demands, snap(slots))
    if refused is None:
        assert answer is None, (case, answer)
    else:
        assert isinstance(answer, Never), case
        assert answer.reason.startswith(f"'{refused}' needs"), (case, answer.reason)


def test_the_refusal_says_what_was_placed_beside_it_and_the_room_left():
    answer = together(pipeline(llm=2600), snap())
    assert isinstance(answer, Never)
    assert "beside 'llm', 'stt'" in answer.reason and "GPU 0: 484 MB" in answer.reason


@pytest.mark.parametrize("case, incoming, held, evictable", [
    ("a request as important as the session may not evict its model", 5, 5, False),
    ("nor one less important", 9, 5, False),
    ("a more important request may", 4, 5, True),
    ("an unheld model: the usual rule", 5, None, True),
])
def test_a_held_model_is_evicted_only_for_a_more_important_request(case, incoming, held,
                                                                   evictable):
    candidates = evict_candidates([view("x", held=held)], incoming, NOW)
    assert bool(candidates) is evictable, case


def test_the_planner_waits_rather_than_evict_a_held_model():
    held = view("x", 3000, held=5)
    assert isinstance(plan(Demand("new", 2000, 5), Snapshot({0: 584}, CEILING, (held,), NOW)),
                      Wait)
    assert isinstance(plan(Demand("new", 2000, 4), Snapshot({0: 584}, CEILING, (held,), NOW)),
                      Evict)
