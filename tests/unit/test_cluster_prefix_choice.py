"""Cache-aware forwarding (model_boss/cluster/choice.py ``where_warm`` with a prefix) as
tables: among the members where a model is READY, the one whose published prompt blocks
match most of the request's prefix, within the load slack; the record that carries them, and
what a member publishes (model_boss/cluster/membership.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from model_boss.cluster import MemberRecord, SlotRecord, There
from model_boss.cluster.choice import matched, where_warm
from model_boss.cluster.membership import PUBLISHED_BLOCKS, Membership
from model_boss.scheduling.replicas.choice import Route
from model_boss.scheduling.replicas.prefixes import PrefixIndex
from model_boss.scheduling.replicas.router import ReplicaRouter
from model_boss.scheduling.states import SlotState
from model_boss.slot_key import slot_key

P = (11, 22, 33, 44)  # a request's chained block hashes: 44 stands for all four blocks


def member(host: str, *slots: SlotRecord, prefixes: dict | None = None,
           models: tuple = ("m", "x")) -> MemberRecord:
    return MemberRecord(host, f"http://{host}", "0", free_mb={0: 8000},
                        ceiling_mb={0: 8000}, models=models, slots=slots,
                        prefixes=prefixes or {})


def slot(model: str = "m", state: str = "ready", active: int = 0, queued: int = 0,
         parallel: int = 1) -> SlotRecord:
    return SlotRecord(model, state, "gpu", active, queued, parallel)


def where(choice) -> str | None:
    if choice is None:
        return None
    return choice.member.host_id if isinstance(choice, There) else "here"


# (case, members, local id, prefix, expected: a host id, "here", or None)
CASES = [
    ("no prefix: the existing order (free slot, then this member)",
     [member("a", slot()), member("b", slot(), prefixes={"m": P})], "a", (), "here"),
    ("no prefix: the existing order (saturated here, free there)",
     [member("a", slot(active=1)), member("b", slot(), prefixes={"m": P})], "a", (), "b"),
    ("the holder wins over an idle member",
     [member("a", slot()), member("b", slot(active=1), prefixes={"m": P})], "a", P, "b"),
    ("the holder wins over this member, idle and first on a tie",
     [member("a", slot()), member("b", slot(), prefixes={"m": P})], "a", P, "b"),
    ("the holder at the slack still wins",
     [member("a", slot()), member("b", slot(active=1, queued=1), prefixes={"m": P})],
     "a", P, "b"),
    ("the holder beyond the slack loses: the existing order",
     [member("a", slot()), member("b", slot(active=1, queued=2), prefixes={"m": P})],
     "a", P, "here"),
    ("the slack is counted from the least loaded READY member",
     [member("a", slot(active=1, queued=2)), member("b", slot(active=1, queued=4),
                                                    prefixes={"m": P})], "a", P, "b"),
    ("the longest match wins",
     [member("a", slot(), prefixes={"m": P[:1]}), member("b", slot(active=1),
                                                          prefixes={"m": P[:3]})],
     "a", P, "b"),
    ("the chain: a later block alone stands for the prefix before it",
     [member("a", slot(), prefixes={"m": (11, 22)}), member("b", slot(active=1),
                                                            prefixes={"m": (33,)})],
     "a", P, "b"),
    ("a block past the request's own counts for nothing",
     [member("a", slot()), member("b", slot(), prefixes={"m": (55, 66)})], "a", P, "here"),
    ("equal matches: the existing order among them",
     [member("a", slot(active=1), prefixes={"m": P}), member("b", slot(), prefixes={"m": P}),
      member("c", slot(), prefixes={"m": P})], "a", P, "b"),
    ("another model's blocks count for nothing",
     [member("a", slot()), member("b", slot(), slot("x"), prefixes={"x": P})], "a", P, "here"),
    ("a holder where the model is not READY is not chosen for it",
     [member("a", slot()), member("b", slot(state="loading"), prefixes={"m": P})],
     "a", P, "here"),
    ("a holder that does not serve the model is not chosen",
     [member("a", slot()), member("b", slot(), prefixes={"m": P}, models=("x",))],
     "a", P, "here"),
    ("no match anywhere: the existing order",
     [member("a", slot(active=1)), member("b", slot())], "a", P, "b"),
    ("nowhere READY: the prefix changes nothing (on its way)",
     [member("a"), member("b", slot(state="loading"))], "a", P, "b"),
    ("nowhere at all", [member("a"), member("b")], "a", P, None),
]


@pytest.mark.parametrize("case,members,local,prefix,expected", CASES, ids=[c[0] for c in CASES])
def test_where_warm_with_a_prefix(case, members, local, prefix, expected):
    assert where(where_warm("m", members, local, prefix)) == expected


def test_no_prefix_is_the_choice_without_one():
    tables = [c[1] for c in CASES]
    for members in tables:
        for local in ("a", "b", "c"):
            assert where_warm("m", members, local, ()) == where_warm("m", members, local)


def test_the_slack_is_given():
    members = [member("a", slot()), member("b", slot(active=1), prefixes={"m": P})]
    assert where(where_warm("m", members, "a", P, slack=1)) == "b"
    assert where(where_warm("m", members, "a", P, slack=0)) == "here"


def test_the_reason_says_how_much_is_cached():
    choice = where_warm("m", [member("a", slot()), member("b", slot(), prefixes={"m": P[:2]})],
                        "a", P)
    assert isinstance(choice, There) and "2 prompt blocks cached" in choice.reason


@pytest.mark.parametrize("held,expected", [
    ((), 0), ((99,), 0), ((11,), 1), ((22,), 2), ((44, 11), 4), ((33, 99), 3)])
def test_matched_is_the_longest_held_prefix(held, expected):
    assert matched(held, P) == expected


def test_records_carry_prefixes_through_json():
    big = (2**64 - 1, 2**63, 1)  # hashes are unsigned 64-bit
    record = member("a", slot(), prefixes={"m": big, "x": (5,)})
    again = MemberRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    assert again.prefixes == {"m": big, "x": (5,)}
    assert again == record


def test_old_records_without_prefixes_parse():
    old = member("a", slot()).to_dict()
    del old["prefixes"]
    record = MemberRecord.from_dict(old)
    assert record.prefixes == {}
    assert where(where_warm("m", [member("b", slot(active=1)), record], "b", P)) == "a"


def publisher(slots: list, index: PrefixIndex) -> Membership:
    membership = Membership.__new__(Membership)  # what record() reads for the prefixes
    membership.pool = SimpleNamespace(slots={s.key: s for s in slots})
    membership.queue = SimpleNamespace(replicas=SimpleNamespace(index=index))
    return membership


def pool_slot(model: str, replica: int = 1, state: str = "ready"):
    return SimpleNamespace(model_id=model, key=slot_key(model, replica), state=state)


def test_a_member_publishes_its_replicas_blocks_under_the_model():
    index = PrefixIndex()
    index.record("m", (1, 2))
    index.record("m#2", (3, 4))
    index.record("x", (5,))
    index.record("gone", (6,))  # not READY here: not published
    published = publisher([pool_slot("m"), pool_slot("m", 2), pool_slot("x"),
                           pool_slot("gone", state="loading")], index).prefixes()
    assert published == {"m": (1, 2, 3, 4), "x": (5,)}


def test_what_a_member_publishes_is_bounded_and_the_latest():
    index = PrefixIndex()
    index.record("m", range(PUBLISHED_BLOCKS * 2))
    index.record("m#2", range(10_000, 10_000 + PUBLISHED_BLOCKS))
    published = publisher([pool_slot("m"), pool_slot("m", 2)], index).prefixes()["m"]
    assert len(published) == PUBLISHED_BLOCKS
    assert published[-1] == 10_000 + PUBLISHED_BLOCKS - 1
    assert PUBLISHED_BLOCKS * 2 - 1 in published and 0 not in published


class Store:
    """The records Redis holds: a member whose TTL ran out is no longer among them."""

    def __init__(self, records: list[MemberRecord]) -> None:
        self.records = records

    async def members(self) -> list[MemberRecord]:
        return list(self.records)


async def test_a_dead_member_leaves_the_index_with_its_record():
    holder = member("b", slot(), prefixes={"m": P})
    store = Store([member("a", slot(active=1)), holder, member("c", slot(active=1))])
    membership = Membership.__new__(Membership)
    membership.store, membership.host_id, membership.view = store, "a", {}
    await membership.refresh()
    assert where(where_warm("m", list(membership.view.values()), "a", P)) == "b"
    store.records.remove(holder)  # its heartbeat stopped; the record expired
    await membership.refresh()
    assert where(where_warm("m", list(membership.view.values()), "a", P)) == "here"


@pytest.mark.parametrize("cluster,replicas,kept", [
    (False, 1, ()), (True, 1, P), (False, 2, P)])
def test_a_member_remembers_what_a_single_copy_was_sent(cluster, replicas, kept):
    """A model with one copy is indexed too in a cluster: the others forward by it."""
    router = ReplicaRouter(SimpleNamespace(cluster=cluster))
    manifest = SimpleNamespace(replicas=SimpleNamespace(max=replicas))
    ready = SimpleNamespace(key="m", state=SlotState.READY, loaded_at=1.0,
                            entry=SimpleNamespace(manifest=manifest))
    router.granted(SimpleNamespace(prefix=P, session=None), ready, Route("m", "only replica"))
    assert tuple(router.index.summary("m")) == kept


# a member that serves a model through a copy past its first is warm too, and its best copy
# (a free parallel slot, then the least busy) is the one weighed against other members'
COPIES = [
    ("only a second copy is ready there", [member("a", slot("m", "idle"), slot("m#2"))], "b",
     "a"),
    ("a second copy with room beats another member's full first copy",
     [member("a", slot("m", active=1)), member("c", slot("m", active=1), slot("m#2"))], "b",
     "c"),
    ("only a second copy is loading there", [member("a", slot("m#2", "loading"))], "b", "a"),
    ("another model's copy is no copy of it", [member("a", slot("x#2"))], "b", None),
]


@pytest.mark.parametrize(("case", "members", "local", "expected"), COPIES,
                         ids=[c[0] for c in COPIES])
def test_where_warm_weighs_every_copy(case, members, local, expected):
    assert where(where_warm("m", members, local)) == expected
