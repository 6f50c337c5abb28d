"""The replica decisions as tables: which replica a request goes to (session, cached prefix,
load, the slack), when one more replica starts, and the prefix index they read."""

from __future__ import annotations

import pytest

from model_boss.scheduling.eviction import SlotView
from model_boss.scheduling.planner import Demand, Evict, Fit, Snapshot, plan
from model_boss.scheduling.replicas import (
    PrefixIndex,
    ReplicaView,
    ScaleView,
    Sessions,
    prompt_blocks,
    route,
    scale_up,
    session_of,
)


def r(key: str, active: int = 0, cached: int = 0, limit: int = 1, state: str = "ready",
      order: int = 0) -> ReplicaView:
    return ReplicaView(key, state, active, limit, cached, order)


@pytest.mark.parametrize("replicas, session, slack, expected", [
    # nothing cached anywhere: the least loaded replica with room
    ([r("a", 1, limit=2), r("b", 0, limit=2)], None, 2, ("b", "least loaded")),
    # the replica with the longest cached prefix, though another is idle
    ([r("a", 1, cached=5, limit=2), r("b", 0, cached=1, limit=2)], None, 2,
     ("a", "cached prefix")),
    # a tie on cache: the less loaded of the two
    ([r("a", 1, cached=3, limit=2), r("b", 0, cached=3, limit=2)], None, 2,
     ("b", "cached prefix")),
    # equally loaded, nothing cached: the one routed to longest ago (new conversations
    # spread over the replicas)
    ([r("a", 0, order=7), r("b", 0, order=3)], None, 2, ("b", "least loaded")),
    # the cached replica is full, within the slack: the request waits for it
    ([r("a", 1, cached=5), r("b", 0)], None, 2, (None, "waits for its replica (cached "
                                                   "prefix)")),
    # the cached replica is busier than the slack allows: the least loaded one
    ([r("a", 4, cached=5, limit=8), r("b", 0, limit=8)], None, 2, ("b", "least loaded")),
    ([r("a", 3, cached=5, limit=8), r("b", 0, limit=8)], None, 3, ("a", "cached prefix")),
    # requests already waiting for the cached replica count as its load: past the slack,
    # the next one goes to the idle replica instead of queueing behind them
    ([ReplicaView("a", "ready", 1, 1, 5, 0, waiting=2), r("b", 0)], None, 2,
     ("b", "least loaded")),
    ([ReplicaView("a", "ready", 1, 1, 5, 0, waiting=1), r("b", 0)], None, 2,
     (None, "waits for its replica (cached prefix)")),
    # the session's replica wins over a longer cached prefix elsewhere
    ([r("a", 0, cached=1, limit=2), r("b", 0, cached=9, limit=2)], "a", 2, ("a", "session")),
    # a session whose replica is gone: the cache decides
    ([r("a", 0, cached=1, limit=2), r("b", 0, cached=9, limit=2)], "c", 2,
     ("b", "cached prefix")),
    # replicas not READY are never chosen
    ([r("a", 0, cached=9, state="loading"), r("b", 0)], None, 2, ("b", "least loaded")),
    ([r("a", 0, state="loading")], None, 2, (None, "no replica is ready")),
    # every replica full, nothing cached: it waits
    ([r("a", 1), r("b", 1)], None, 2, (None, "every replica is full")),
])
def test_a_request_goes_where_its_prefix_is_unless_that_replica_is_too_busy(
        replicas, session, slack, expected):
    chosen = route(replicas, session_replica=session, slack=slack)
    assert (chosen.key, chosen.reason) == expected


def test_the_baselines_ignore_the_cache():
    replicas = [r("a", 0, cached=9, limit=2, order=5), r("b", 1, limit=2, order=2)]
    assert route(replicas, policy="round_robin").key == "b"  # routed to longest ago
    assert route(replicas, policy="least_loaded").key == "a"
    assert route([r("a", 1, cached=9, limit=2), r("b", 0, limit=2)],
                 policy="least_loaded").key == "b"


def scale(replicas=1, loading=0, full=True, waiting=3, oldest=5.0, low=1, high=2):
    return ScaleView("m", replicas, loading, full, waiting, oldest, low, high)


@pytest.mark.parametrize("view, expected", [
    (scale(), True),  # full, waited past the threshold, below max
    (scale(oldest=0.5), False),  # not waited long enough
    (scale(full=False), False),  # a replica has room: the queue will use it
    (scale(replicas=2), False),  # at max
    (scale(waiting=0), False),  # nobody waits
    (scale(replicas=2, loading=1, high=3), False),  # one load at a time
    (scale(full=False, oldest=0, low=2), True),  # below min: at once, anyone waiting
    (scale(replicas=2, loading=1, full=False, oldest=0, low=3, high=3), True),
])
def test_one_more_replica_when_every_one_is_full_and_its_waiters_waited(view, expected):
    assert scale_up(view, wait_s=2.0) is expected


def test_a_replica_is_placed_off_its_siblings_gpus_and_never_evicts_them():
    demand = Demand("m#2", 800, 5, avoid_gpus=frozenset({0}), siblings=frozenset({"m"}))
    sibling = SlotView("m", "ready", False, 0, 0.0, 5, None, {0: 800})
    snapshot = Snapshot({0: 3000, 1: 1000}, {0: 4000, 1: 2000}, (sibling,), 0.0)
    placed = plan(demand, snapshot)
    assert isinstance(placed, Fit) and placed.placement.allocations == {1: 800}
    crowded = Snapshot({0: 3000, 1: 100}, {0: 4000, 1: 2000},
                       (sibling, SlotView("other", "ready", False, 0, 0.0, 50, 1.0,
                                          {1: 1900})), 10.0)
    made = plan(demand, crowded)  # room on GPU 1 is made by evicting another model
    assert isinstance(made, Evict) and made.victims == ("other",)
    alone = Snapshot({0: 3000, 1: 100}, {0: 4000, 1: 2000}, (sibling,), 10.0)
    assert not plan(demand, alone).can_start  # the sibling is never a victim


CONVERSATION = [{"role": "system", "content": "You review code. " * 80},
                {"role": "user", "content": "Look at this function."}]


def test_prompt_blocks_chain_so_a_longer_conversation_extends_a_shorter_one():
    first = prompt_blocks({"messages": CONVERSATION})
    longer = prompt_blocks({"messages": [*CONVERSATION, {"role": "assistant",
                                                          "content": "It is fine. " * 40}]})
    assert len(first) >= 5 and longer[:len(first)] == first and len(longer) > len(first)
    other = prompt_blocks({"messages": [{"role": "system", "content": "You write poems. "
                                         * 80}, CONVERSATION[1]]})
    assert other[0] != first[0] and not set(other) & set(first)  # the chain: nothing shared
    anthropic = prompt_blocks({"system": "You review code. " * 80,
                               "messages": [CONVERSATION[1]]})
    assert anthropic == first  # Anthropic's system field renders as a system message
    assert prompt_blocks({"messages": [{"role": "user", "content": "hi"}]}) == ()


def test_the_index_matches_the_longest_held_prefix_and_forgets_the_oldest():
    blocks = prompt_blocks({"messages": CONVERSATION})
    index = PrefixIndex(max_blocks=len(blocks) + 2)
    index.record("a", blocks[:3])
    assert index.matched("a", blocks) == 3 and index.matched("b", blocks) == 0
    index.record("a", blocks)
    assert index.matched("a", blocks) == len(blocks)
    index.record("a", (1, 2, 3))  # the oldest hashes go first
    assert index.matched("a", blocks) == len(blocks)  # its last hash still stands for it all
    assert index.matched("a", blocks[:1]) == 0
    index.forget("a")
    assert index.matched("a", blocks) == 0


def test_sessions_come_from_the_header_then_anthropic_then_openai_and_stay_bounded():
    assert session_of({"user": "u", "metadata": {"user_id": "m"}}, "h") == "h"
    assert session_of({"user": "u", "metadata": {"user_id": "m"}}, None) == "m"
    assert session_of({"user": "u"}, None) == "u"
    assert session_of({}, None) is None
    sessions = Sessions(limit=2)
    for name, replica in (("s1", "a"), ("s2", "b"), ("s3", "a")):
        sessions.served(name, replica)
    assert (sessions.get("s1"), sessions.get("s2"), sessions.get("s3")) == (None, "b", "a")
    sessions.forget("a")
    assert sessions.get("s3") is None and sessions.get("s2") == "b"


def test_requests_left_waiting_for_a_replica_count_as_its_queue_within_a_pass():
    """Three waiters whose prefix is on the busy replica: two wait for it (the slack), the
    third goes to the idle one; a new pass counts afresh."""
    from types import SimpleNamespace

    from model_boss.scheduling.replicas import ReplicaRouter
    from model_boss.settings import Settings

    def copy(key: str, active: int) -> SimpleNamespace:
        manifest = SimpleNamespace(running_limit=1, replicas=SimpleNamespace(min=1, max=2))
        return SimpleNamespace(slot=SimpleNamespace(
            key=key, state="ready", active=active, loaded_at=1.0, entry=SimpleNamespace(
                manifest=manifest)))

    blocks = prompt_blocks({"messages": CONVERSATION})
    router = ReplicaRouter(Settings(replica_load_slack=2))
    router.index.record("a", blocks)
    owners = [copy("a", 1), copy("b", 0)]

    def ask() -> str | None:
        request = SimpleNamespace(model_id="m", prefix=blocks, session=None, submitted_at=0.0)
        return router.pick(request, owners)[1].key

    router.begin_pass()
    assert [ask(), ask(), ask()] == [None, None, "b"]
    router.begin_pass()
    assert ask() is None


# the one prefix-and-slack rule replicas and cluster members share: (candidates as
# (name, cached blocks, load) in preference order, slack, the holder chosen or None)
HOLDERS = [
    ("most blocks wins", [("a", 1, 0), ("b", 3, 1)], 2, ("b", 3)),
    ("the first of equals", [("a", 2, 0), ("b", 2, 0)], 2, ("a", 2)),
    ("none holds any", [("a", 0, 0), ("b", 0, 5)], 2, None),
    ("within the slack", [("a", 0, 0), ("b", 4, 2)], 2, ("b", 4)),
    ("beyond the slack", [("a", 0, 0), ("b", 4, 3)], 2, None),
    ("the least loaded is the holder", [("a", 5, 0), ("b", 1, 9)], 0, ("a", 5)),
]


@pytest.mark.parametrize("candidates, slack, wanted", [h[1:] for h in HOLDERS],
                         ids=[h[0] for h in HOLDERS])
def test_the_prefix_holder_rule(candidates, slack, wanted) -> None:
    from model_boss.scheduling.replicas.choice import prefix_holder

    assert prefix_holder(candidates, slack) == wanted
