"""One more copy on another member (model_boss/cluster/choice.py ``scale_out``) as a table:
when every READY copy of a model is full and its requests wait, the cheapest member holding
none loads it; else the rules as before. Plus the record's wait field and the backlog's."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from model_boss.cluster import Here, MemberRecord, SlotRecord, There, choose_member
from model_boss.cluster.choice import copy_wanted, scale_out
from model_boss.cluster.cluster import Cluster
from model_boss.cluster.membership import Membership
from model_boss.scheduling.eviction import SlotView
from model_boss.scheduling.planner import Demand, Snapshot
from model_boss.scheduling.request import Backlog, QueuedRequest
from model_boss.slot_key import model_of, slot_key

NOW = 1000.0
WAIT_S = 2.0
DEMAND = Demand("m", 3000, 5)


def member(host: str, *slots: SlotRecord, free: int = 8000, ceiling: int = 8000,
           models: tuple = ("m", "x"), queue: int = 0, age: float = 0.0) -> MemberRecord:
    return MemberRecord(host, f"http://{host}", "0", free_mb={0: free},
                        ceiling_mb={0: ceiling}, models=models, slots=slots,
                        queue_depth=queue, updated_at=NOW - age)


def slot(model: str = "m", state: str = "ready", active: int = 1, queued: int = 2,
         parallel: int = 1, waited: float = 3.0, mb: int = 2000, priority: int = 5,
         pinned: bool = False) -> SlotRecord:
    return SlotRecord(model, state, "gpu", active, queued, parallel, pinned, 900.0,
                      priority, None, {0: mb}, oldest_wait_s=waited)


def where(choice) -> str | None:
    if choice is None:
        return None
    kind = "cold" if choice.cold else "warm"
    return f"{choice.member.host_id if isinstance(choice, There) else 'here'} {kind}"


# (case, members, local id, replicas max, expected scale_out: None or "<member> cold")
CASES = [
    ("full and waiting: the member without a copy loads one",
     [member("a", slot()), member("b")], "a", 2, "b cold"),
    ("this member holds none: it loads one itself",
     [member("a", slot()), member("b")], "b", 2, "here cold"),
    ("max 1: never",
     [member("a", slot()), member("b")], "a", 1, None),
    ("a parallel place free: no copy",
     [member("a", slot(active=1, parallel=2)), member("b")], "a", 2, None),
    ("not waited long enough: no copy",
     [member("a", slot(waited=1.0)), member("b")], "a", 2, None),
    ("nothing waiting: no copy",
     [member("a", slot(queued=0, waited=0.0)), member("b")], "a", 2, None),
    ("the wait grows with the record's age",
     [member("a", slot(waited=1.0), age=1.5), member("b")], "a", 2, "b cold"),
    ("the longest waiter of the READY members counts",
     [member("a", slot(waited=0.5)), member("c", slot(waited=2.5)), member("b")], "a", 3,
     "b cold"),
    ("as many copies as max: no more",
     [member("a", slot()), member("c", slot()), member("b")], "a", 2, None),
    ("a replica on one member counts as a copy",
     [member("a", slot(), slot("m#2")), member("b")], "a", 2, None),
    ("a copy free anywhere: no copy",
     [member("a", slot()), member("c", slot(active=0, queued=0, waited=0.0)), member("b")],
     "a", 3, None),
    ("a copy loading: one load at a time",
     [member("a", slot()), member("c", slot(state="loading", active=0)), member("b")],
     "a", 3, None),
    ("a copy parked in RAM counts towards max",
     [member("a", slot()), member("c", slot(state="offloaded", active=0)), member("b")],
     "a", 2, None),
    ("the cheapest of the members without one: room beats evicting",
     [member("a", slot()), member("b", slot("x", active=0, mb=6000), free=2000),
      member("c")], "a", 2, "c cold"),
    ("evicting is allowed",
     [member("a", slot()), member("b", slot("x", active=0, queued=0, mb=6000),
                                  free=2000)], "a", 2, "b cold"),
    ("a member that would have to wait is not chosen",
     [member("a", slot()), member("b", slot("x", active=1, mb=6000), free=2000)], "a", 2,
     None),
    ("a member where it never fits is not chosen",
     [member("a", slot()), member("b", free=1000, ceiling=1000)], "a", 2, None),
    ("a member that does not serve it is not chosen",
     [member("a", slot()), member("b", models=("x",))], "a", 2, None),
    ("nowhere READY: the cold rule's business, not this one",
     [member("a"), member("b")], "a", 2, None),
]


@pytest.mark.parametrize("case,members,local,most,expected", CASES, ids=[c[0] for c in CASES])
def test_scale_out(case, members, local, most, expected):
    assert where(scale_out(DEMAND, members, local, NOW, most, WAIT_S)) == expected


@pytest.mark.parametrize("case,members,local,most,expected", CASES, ids=[c[0] for c in CASES])
def test_choose_member_takes_the_copy_first_else_as_before(case, members, local, most,
                                                           expected):
    choice = choose_member(DEMAND, members, local, NOW, replicas_max=most, wait_s=WAIT_S)
    before = choose_member(DEMAND, members, local, NOW)  # replicas max 1: today's rules
    assert where(choice) == (expected or where(before))


def test_max_one_is_the_old_choice_whatever_the_wait():
    members = [member("a", slot(waited=60.0)), member("b")]
    assert not copy_wanted("m", members, NOW, 1, 0.0)
    assert isinstance(choose_member(DEMAND, members, "a", NOW), Here)


def test_a_zero_wait_still_needs_a_waiter():
    assert copy_wanted("m", [member("a", slot(waited=0.0, queued=1))], NOW, 2, 0.0)
    assert not copy_wanted("m", [member("a", slot(waited=0.0, queued=0))], NOW, 2, 0.0)


def test_the_record_carries_the_wait_and_old_records_parse():
    record = member("a", slot(waited=1.25))
    assert MemberRecord.from_dict(record.to_dict()).slots[0].oldest_wait_s == 1.25
    old = record.to_dict()
    del old["slots"][0]["oldest_wait_s"]
    assert MemberRecord.from_dict(old).slots[0].oldest_wait_s == 0.0


def test_the_backlog_knows_each_models_longest_waiter():
    async def run() -> dict[str, float]:
        backlog = Backlog()
        for model, at in (("m", 10.0), ("x", 5.0), ("m", 7.0), ("m", 12.0)):
            backlog.add(QueuedRequest(model, 5, submitted_at=at))
        first = backlog.first_submitted()
        backlog.discard(next(r for r in backlog if r.submitted_at == 7.0))
        return {**first, "m after": backlog.first_submitted()["m"]}

    assert asyncio.run(run()) == {"m": 7.0, "x": 5.0, "m after": 10.0}


def test_a_members_record_counts_its_models_waiters_on_every_copy():
    async def run() -> dict[str, int]:
        backlog = Backlog()
        for at in (10.0, 11.0, 12.0):
            backlog.add(QueuedRequest("m", 5, submitted_at=at))
        views = tuple(SlotView(key, "ready", False, 1, 900.0, 5, None, {gpu: 2000})
                      for gpu, key in enumerate((slot_key("m"), slot_key("m", 2))))
        membership = Membership.__new__(Membership)  # what record() reads
        membership.pool = SimpleNamespace(
            snapshot=lambda: _resolved(Snapshot({0: 0, 1: 0}, {0: 8000, 1: 8000}, views)),
            slots={v.key: SimpleNamespace(model_id=model_of(v.key), tier="gpu", parallel=1)
                   for v in views},
            boss=SimpleNamespace(gpus=[]))
        membership.queue = SimpleNamespace(backlog=backlog, depth=len(backlog))
        membership.catalog, membership.host_id, membership.url = [], "a", "http://a"
        membership.started_at = 0.0
        membership.prefixes = dict
        record = await membership.record()
        return {s.model: s.queued for s in record.slots}

    # the waiters are the model's: either copy may take them, so each says so
    assert asyncio.run(run()) == {"m": 3, "m#2": 3}


async def _resolved(value):
    return value


@pytest.mark.parametrize("case, here, there, warm_here, warm_elsewhere", [
    ("a ready copy is its model", {"m": "ready"}, ("x",), {"m"}, {"x"}),
    ("a second copy alone is its model", {"m": "idle", "m#2": "ready"}, ("x#2",), {"m"},
     {"x"}),
    ("two copies are one model", {"m": "ready", "m#2": "ready"}, ("x", "x#2"), {"m"}, {"x"}),
])
def test_job_streams_are_taken_by_model_not_by_copy(case, here, there, warm_here,
                                                      warm_elsewhere):
    cluster = Cluster.__new__(Cluster)
    cluster.host_id = "a"
    cluster.pool = SimpleNamespace(slots={k: SimpleNamespace(state=v) for k, v in here.items()})
    other = member("b", *(slot(key) for key in there))
    cluster.membership = SimpleNamespace(view={"b": other})
    assert cluster._warm_here() == warm_here, case
    assert cluster._warm_elsewhere() == warm_elsewhere, case


class Store:
    """The load lock alone: free, or named for another member."""

    def __init__(self, holder: str | None = None) -> None:
        self.holder = holder
        self.kept: list[tuple[str, float]] = []

    async def take_load(self, model: str, host: str, ttl_s: float) -> tuple[bool, str]:
        if self.holder is None:
            self.holder = host
            return True, host
        return False, self.holder

    async def keep_load(self, model: str, host: str, ttl_s: float) -> bool:
        self.kept.append((host, ttl_s))
        return True


def routing(members: list[MemberRecord], most: int, store: Store):
    """A Cluster's routing part alone for member "a": no Redis, records as given."""
    entry = SimpleNamespace(manifest=SimpleNamespace(id="m", replicas=SimpleNamespace(max=most)))

    async def refresh() -> None:
        return None

    cluster = Cluster.__new__(Cluster)
    cluster.host_id = "a"
    cluster.settings = SimpleNamespace(
        replica_scale_wait_s=WAIT_S, replica_load_slack=2, replica_routing="cache",
        cluster_load_lock_s=10.0)
    cluster.catalog = SimpleNamespace(find=lambda name: entry, get_available=lambda name: entry)
    cluster.pool = SimpleNamespace(slots={"m": SimpleNamespace(state="ready")},
                                   demand=lambda entry, priority: Demand("m", 3000, priority))
    cluster.membership = SimpleNamespace(view={m.host_id: m for m in members}, url="http://a",
                                         refresh=refresh)
    cluster.store = store
    return cluster


def fresh(*slots: SlotRecord) -> MemberRecord:
    return MemberRecord("a", "http://a", "0", free_mb={0: 0}, ceiling_mb={0: 8000},
                        models=("m",), slots=slots, updated_at=time.time())


def test_route_names_the_member_that_loads_a_copy_under_the_load_lock():
    b = MemberRecord("b", "http://b", "0", free_mb={0: 8000}, ceiling_mb={0: 8000},
                     models=("m",))
    members = [fresh(slot()), b]
    store = Store()
    cluster = routing(members, 2, store)
    assert cluster.warm_route("m") is None  # the full path decides, under the lock
    route = asyncio.run(cluster.route("m", 5))
    assert (route.member.host_id, route.loader, route.model) == ("b", "b", "m")
    assert store.holder == "b"
    # another request meanwhile: the lock names b, so it goes there too
    assert asyncio.run(cluster.route("m", 5)).member.host_id == "b"
    # replicas max 1: served here, as ever
    assert routing(members, 1, Store()).warm_route("m").member is None
