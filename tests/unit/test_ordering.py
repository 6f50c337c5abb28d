"""Serving order, table-driven: aging, fair share among clients and among one key's end
users, warm grouping."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_boss.scheduling.ordering import (
    STRICT,
    Lines,
    OrderPolicy,
    Waiter,
    dealt_ranks,
    effective_priority,
    end_user_turns,
    rank_on_arrival,
    serving_order,
    wait_bound_s,
)

AGING = OrderPolicy(aging_s=2.0)


def w(tag, priority=5, at=0.0, client="c", model="m", share=1.0):
    return Waiter(model, priority, client, at), tag, share


def order(items, policy=AGING, warm=None):
    """Queue ``items`` in arrival order (each ranked on arrival), then order them."""
    queued, tags = [], {}
    for waiter, tag, share in sorted(items, key=lambda item: item[0].submitted_at):
        ranked = replace(waiter, rank=rank_on_arrival(queued, waiter.client_id,
                                                      waiter.priority, share))
        queued.append(ranked)
        tags[id(ranked)] = tag
    return [tags[id(x)] for x in serving_order(queued, warm or {}, policy)]


@pytest.mark.parametrize("case, items, warm, policy, expected", [
    ("priority first, then arrival",
     [w("p5", 5, 0.0), w("p1", 1, 1.0), w("p5-later", 5, 2.0)], {}, AGING,
     ["p1", "p5", "p5-later"]),
    ("a p9 that waited 9 aging steps is ahead of a fresh p0",
     [w("p9-old", 9, 0.0, "b"), w("p0-new", 0, 18.5, "a")], {}, AGING, ["p9-old", "p0-new"]),
    ("... but not before",
     [w("p9-old", 9, 0.0, "b"), w("p0-new", 0, 17.5, "a")], {}, AGING, ["p0-new", "p9-old"]),
    ("strict priority never ages",
     [w("p9-old", 9, 0.0, "b"), w("p0-new", 0, 1000.0, "a")], {}, STRICT,
     ["p0-new", "p9-old"]),
    ("fair share: a single request after another client's burst is second",
     [*[w(f"burst{i}", 5, i * 0.001, "flood") for i in range(12)], w("single", 5, 0.5, "b")],
     {}, AGING, ["burst0", "single", *[f"burst{i}" for i in range(1, 12)]]),
    ("turns do not shrink with faster aging",
     [*[w(f"burst{i}", 5, i * 0.001, "flood") for i in range(4)], w("single", 5, 0.5, "b")],
     {}, OrderPolicy(aging_s=0.25), ["burst0", "single", "burst1", "burst2", "burst3"]),
    ("without fair share the burst goes first",
     [*[w(f"burst{i}", 5, i * 0.001, "flood") for i in range(3)], w("single", 5, 0.5, "b")],
     {}, OrderPolicy(aging_s=2.0, fair_share=False), ["burst0", "burst1", "burst2", "single"]),
    ("a share of 2 takes two turns for one",
     [w("a1", at=0.0, client="a", share=2.0), w("a2", at=0.1, client="a", share=2.0),
      w("a3", at=0.2, client="a", share=2.0), w("b1", at=0.3, client="b"),
      w("b2", at=0.4, client="b")], {}, AGING, ["a1", "b1", "a2", "a3", "b2"]),
    ("ranks count per priority: a client's p0 is not behind its own p5",
     [w("c-p5", 5, 0.0), w("c-p0", 0, 0.1)], {}, AGING, ["c-p0", "c-p5"]),
    ("warm requests run as a group before a swap of equal priority",
     [w("cold", 5, 0.0, "a", model="x"), w("warm", 5, 1.0, "b", model="y")], {"y": 3.0},
     AGING, ["warm", "cold"]),
    ("the warm credit is bounded: a cold request waiting longer goes first",
     [w("cold", 5, 0.0, "a", model="x"), w("warm", 5, 4.0, "b", model="y")], {"y": 3.0},
     AGING,
     ["cold", "warm"]),
    ("strict order: warm first within a priority, never across",
     [w("cold", 5, 0.0, model="x"), w("warm", 5, 9.0, model="y"),
      w("urgent-cold", 1, 10.0, model="x")], {"y": 1.0}, STRICT,
     ["urgent-cold", "warm", "cold"]),
])
def test_serving_order(case, items, warm, policy, expected):
    assert order(items, policy, warm) == expected, case


@pytest.mark.parametrize("priority, waited, policy, expected", [
    (9, 0.0, AGING, 9),
    (9, 1.9, AGING, 9),
    (9, 2.0, AGING, 8),
    (9, 18.0, AGING, 0),
    (9, 30.0, AGING, -6),   # keeps rising: it may evict what a priority-0 client left idle
    (9, 1e6, STRICT, 9),
    (5, -1.0, AGING, 5),    # a clock step back never lowers it
])
def test_effective_priority(priority, waited, policy, expected):
    assert effective_priority(priority, waited, policy) == expected


def test_ranks_are_fixed_on_arrival_so_a_burst_keeps_its_places():
    burst = []
    for i in range(12):
        burst.append(Waiter("m", 5, "flood", i * 0.001,
                            rank_on_arrival(burst, "flood", 5)))
    single = Waiter("m", 5, "single", 1.5, rank_on_arrival(burst, "single", 5))
    remaining = burst[3:]  # three of the burst were served meanwhile
    ordered = serving_order([*remaining, single], {}, AGING)
    assert ordered.index(single) <= 1  # only burst-3 (due at +6 s) may still be ahead


@pytest.mark.parametrize("end_users, turns", [
    ("", []),
    ("a", [0]),
    ("aaa", [0, 1, 2]),
    ("aab", [0, 1, 0]),
    ("abab", [0, 0, 1, 1]),
    ("aaab", [0, 1, 2, 0]),
])
def test_end_user_turns(end_users, turns):
    assert end_user_turns(list(end_users)) == turns


@pytest.mark.parametrize("case, end_users, ranks, dealt", [
    ("one end user keeps its ranks", "aaa", [0, 1, 2], [0, 1, 2]),
    ("one end user's ranks are put in its arrival order", "aaa", [2, 0, 1], [0, 1, 2]),
    ("a second end user's first comes after the first's first", "aaaab", [0, 1, 2, 3, 4],
     [0, 2, 3, 4, 1]),
    ("after a burst partly served: the ranks held are dealt", "aaaab", [3, 4, 5, 6, 4],
     [3, 4, 5, 6, 4]),
    ("three end users, round-robin", "aabbc", [0, 1, 2, 3, 4], [0, 3, 1, 4, 2]),
    ("an end user's own order is kept", "abab", [0, 1, 2, 3], [0, 1, 2, 3]),
    ("bursts of two end users interleave", "aaabbb", [0, 1, 2, 3, 4, 5],
     [0, 2, 4, 1, 3, 5]),
    ("shares: the ranks are the key's, whatever they are", "aab", [0, 0.5, 1.0],
     [0, 1.0, 0.5]),
])
def test_dealt_ranks(case, end_users, ranks, dealt):
    got = dealt_ranks(list(end_users), [float(r) for r in ranks])
    assert got == [float(r) for r in dealt], case
    assert sorted(got) == sorted(float(r) for r in ranks), "the key's ranks are kept"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 20)), max_size=30))
def test_dealing_keeps_the_keys_ranks_and_each_end_users_order(rows):
    end_users, ranks = [e for e, _ in rows], [float(r) for _, r in rows]
    dealt = dealt_ranks(end_users, ranks)
    assert sorted(dealt) == sorted(ranks)
    for end_user in set(end_users):
        own = [r for e, r in zip(end_users, dealt, strict=True) if e == end_user]
        assert own == sorted(own)


def test_an_end_users_single_request_after_anothers_burst_under_one_key():
    """Two levels: a key's burst from one end user, then one request from another end user
    of the same key, is served among the first few, as between two clients."""
    burst = []
    for i in range(12):
        burst.append(Waiter("m", 5, "key", i * 0.001, rank_on_arrival(burst, "key", 5)))
    remaining = burst[3:]  # three of the burst were served meanwhile
    single = Waiter("m", 5, "key", 1.5, rank_on_arrival(remaining, "key", 5))
    waiting = [*remaining, single]
    dealt = dealt_ranks(["a"] * len(remaining) + ["b"], [x.rank for x in waiting])
    ranked = [replace(x, rank=rank) for x, rank in zip(waiting, dealt, strict=True)]
    assert [x.submitted_at for x in serving_order(ranked, {}, AGING)].index(1.5) <= 2
    # one level only (today's rank, the key's): it waited behind the whole burst
    assert serving_order(waiting, {}, AGING).index(single) >= 5


def test_wait_bound_with_one_second_loads():
    bound = wait_bound_s(9, most_important=0, aging_s=2.0, warm_credit_s=1.0, drain_s=1.0,
                         load_s=1.0)
    assert bound == 21.0


class _Waiting:
    """A waiting request as the lines see one."""

    def __init__(self, waiter: Waiter) -> None:
        self.waiter, self.model_id = waiter, waiter.model_id


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 9), st.sampled_from("xyz"),
                          st.integers(0, 50), st.integers(0, 4), st.booleans()),
                min_size=0, max_size=40),
       st.dictionaries(st.sampled_from("abc"), st.floats(0.5, 30)),
       st.sampled_from([OrderPolicy(), STRICT, OrderPolicy(aging_s=1.0, fair_share=False)]))
def test_the_lines_walk_in_the_serving_order(rows, credits, policy):
    """The order the queue keeps incrementally is serving_order's, whatever came and went,
    for any warm credits; a dropped model's requests are left out of the rest of the walk."""
    lines, kept = Lines(policy), []
    for model, priority, client, at, rank, leaves in rows:
        item = _Waiting(Waiter(model, priority, client, float(at), float(rank)))
        lines.add(item)
        kept.append(item)
        if leaves and len(kept) > 1:
            gone = kept.pop(len(kept) // 2)
            lines.discard(gone)
    expected = serving_order([i.waiter for i in kept], credits, policy)
    assert [i.waiter for i in lines.walk(credits)] == expected
    head = lines.head(credits)
    assert (head.waiter if head is not None else None) == (expected[0] if expected else None)
    assert lines.models(credits) == list(dict.fromkeys(w.model_id for w in expected))
    walk, seen = lines.walk(credits), []
    for item in walk:
        seen.append(item.waiter)
        if item.model_id == "a":
            walk.drop("a")
    first_a = next((i for i, w in enumerate(expected) if w.model_id == "a"), None)
    assert seen == [w for i, w in enumerate(expected) if w.model_id != "a" or i == first_a]
