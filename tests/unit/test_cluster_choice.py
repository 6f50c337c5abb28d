"""The member choice (model_boss/cluster/choice.py) as tables, plus the cluster settings,
the record round trip and the forward check."""

from __future__ import annotations

import pytest

from model_boss.cluster import (
    Here,
    MemberRecord,
    SlotRecord,
    There,
    choose_member,
    forward_refusal,
)
from model_boss.cluster.shared import merge_learned, own_figures
from model_boss.errors import ConfigError
from model_boss.scheduling.learned import LearnedStats
from model_boss.scheduling.planner import Demand
from model_boss.settings import load_settings

NOW = 1000.0


def member(host: str, free: int = 8000, ceiling: int = 8000, slots: tuple = (),
           models: tuple = ("m", "big", "x"), queue: int = 0) -> MemberRecord:
    return MemberRecord(host, f"http://{host}", "0", free_mb={0: free},
                        ceiling_mb={0: ceiling}, models=models, slots=slots,
                        queue_depth=queue)


def slot(model: str, state: str = "ready", active: int = 0, queued: int = 0,
         parallel: int = 1, mb: int = 2000, priority: int = 5, pinned: bool = False,
         last_used: float = 900.0) -> SlotRecord:
    return SlotRecord(model, state, "gpu" if state != "offloaded" else "cpu", active, queued,
                      parallel, pinned, last_used, priority, None,
                      {0: mb} if state != "offloaded" else {})


DEMAND = Demand("m", 3000, 5)

# (case, members, local id, expected kind, expected member, cold)
CASES = [
    ("ready elsewhere: forward there",
     [member("a"), member("b"), member("c", slots=(slot("m"),))], "a", There, "c", False),
    ("ready here and there: here",
     [member("a", slots=(slot("m"),)), member("c", slots=(slot("m"),))], "a", Here, "a", False),
    ("ready here but saturated, free elsewhere: there",
     [member("a", slots=(slot("m", active=1, queued=2),)),
      member("c", slots=(slot("m"),))], "a", There, "c", False),
    ("all saturated: the shortest queue",
     [member("a", slots=(slot("m", active=1, queued=3),)),
      member("b", slots=(slot("m", active=1, queued=1),)),
      member("c", slots=(slot("m", active=1, queued=2),))], "a", There, "b", False),
    ("parallel slots free count",
     [member("a", slots=(slot("m", active=2, parallel=2),)),
      member("b", slots=(slot("m", active=2, parallel=4),))], "a", There, "b", False),
    ("loading elsewhere: join it, no second copy",
     [member("a"), member("b", slots=(slot("m", state="loading"),))], "a", There, "b", False),
    ("offloaded to CPU RAM elsewhere: onload there",
     [member("a"), member("b", slots=(slot("m", state="offloaded"),))], "a", There, "b",
     False),
    ("ready beats loading",
     [member("a", slots=(slot("m", state="loading"),)), member("b", slots=(slot("m"),))],
     "a", There, "b", False),
    ("nowhere: the member with room",
     [member("a", free=1000), member("b", free=500), member("c", free=5000)], "a", There,
     "c", True),
    ("nowhere, room here and there: here",
     [member("a", free=5000), member("b", free=5000)], "b", Here, "b", True),
    ("nowhere, room on two: the shorter queue",
     [member("a", free=5000, queue=3), member("b", free=5000, queue=1)], "a", There, "b",
     True),
    ("nowhere, no room: the cheapest eviction",
     [member("a", free=0, slots=(slot("x", mb=6000),)),
      member("b", free=0, slots=(slot("x", mb=3500),))], "a", There, "b", True),
    ("eviction beats waiting",
     [member("a", free=0, slots=(slot("x", active=1),)),
      member("b", free=1500, slots=(slot("x", mb=2000),))], "a", There, "b", True),
    ("waiting beats never",
     [member("a", free=0, ceiling=2000), member("b", free=0, slots=(slot("x", active=1),))],
     "a", There, "b", True),
    ("a member without the model is never chosen",
     [member("a", free=0, ceiling=1000), member("b", free=9000, models=("x",))], "a", Here,
     "a", False),
    ("pinned models are not evicted",
     [member("a", free=0, ceiling=4000, slots=(slot("x", mb=4000, pinned=True),)),
      member("b", free=0, slots=(slot("x", mb=4000, active=1),))], "a", There, "b", True),
    ("nobody has heard of it: here",
     [member("a", models=()), member("b", models=())], "a", Here, "a", False),
]


@pytest.mark.parametrize("case,members,local,kind,where,cold", CASES,
                         ids=[c[0] for c in CASES])
def test_choose_member(case, members, local, kind, where, cold):
    choice = choose_member(DEMAND, members, local, NOW)
    assert isinstance(choice, kind), choice
    assert (choice.member.host_id if isinstance(choice, There) else local) == where
    assert choice.cold is cold
    assert choice.reason


def test_every_member_names_the_same_loader():
    """Given the same records, each member picks the same one (a burst loads once)."""
    members = [member("a", free=5000), member("b", free=5000), member("c", free=5000)]
    picked = {(c.member.host_id if isinstance(c, There) else local)
              for local in "abc" for c in [choose_member(DEMAND, members, local, NOW)]}
    assert len(picked) == 3  # ties go to the asking member: it needs no hop
    members = [member("a", free=5000, queue=1), member("b", free=5000),
               member("c", free=5000, queue=1)]
    picked = {(c.member.host_id if isinstance(c, There) else local)
              for local in "abc" for c in [choose_member(DEMAND, members, local, NOW)]}
    assert picked == {"b"}


def test_record_round_trip():
    record = member("a", slots=(slot("m", active=1, parallel=4),))
    again = MemberRecord.from_dict(record.to_dict())
    assert again == record
    assert again.to_dict()["slots"][0]["parallel_free"] == 3


@pytest.mark.parametrize("headers,secret,refused", [
    ({}, None, False),
    ({}, "s3cret", False),
    ({"x-model-boss-forwarded": "a"}, None, True),
    ({"x-model-boss-forwarded": "a"}, "s3cret", True),
    ({"x-model-boss-forwarded": "a", "x-model-boss-cluster-secret": "wrong"}, "s3cret", True),
    ({"x-model-boss-forwarded": "a", "x-model-boss-cluster-secret": "s3cret"}, "s3cret",
     False),
])
def test_forward_refusal(headers, secret, refused):
    assert (forward_refusal(headers, secret) is not None) is refused


@pytest.mark.parametrize("overrides,message", [
    ({"cluster": True}, "needs redis_url"),
    ({"cluster": True, "redis_url": "redis://x"}, "needs cluster_secret"),
    ({"cluster": True, "redis_url": "redis://x", "cluster_secret": "s",
      "cluster_heartbeat_s": 5, "cluster_member_ttl_s": 2}, "longer than"),
])
def test_cluster_settings_are_checked(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_settings(None, **overrides)


def test_cluster_settings_defaults(monkeypatch):
    monkeypatch.setenv("MODEL_BOSS_CLUSTER_SECRET", "from-env")
    settings = load_settings(None, cluster=True, redis_url="redis://r", port=9000)
    assert settings.cluster_secret.get_secret_value() == "from-env"
    assert settings.member_url == "http://127.0.0.1:9000"
    assert settings.member_id.endswith(":9000")
    assert load_settings(None, advertise_url="http://gpu1:80/", host_id="gpu1").member_url \
        == "http://gpu1:80"


def test_learned_figures_fill_only_what_was_not_measured_here():
    stats = LearnedStats()
    stats.observe_load("mine", 3.0)
    stats.observe_vram("mine", 900)
    shared = {"mine": {"load_s": 9.0, "loads": 4, "vram_mb": 100, "infer_s": 0.5,
                       "requests": 7},
              "theirs": {"load_s": 2.5, "loads": 2, "vram_mb": 1200, "infer_s": None,
                         "requests": 0}}
    assert merge_learned(stats, shared) == ["mine", "theirs"]
    assert (stats.get("mine").load_s, stats.get("mine").vram_mb) == (3.0, 900)  # own kept
    assert stats.get("mine").infer_s == 0.5  # never measured here: taken
    assert (stats.get("theirs").load_s, stats.get("theirs").vram_mb) == (2.5, 1200)
    assert merge_learned(stats, shared) == []  # nothing new the second time
    assert set(own_figures(stats)) == {"mine", "theirs"}


def test_ps_cluster_table():
    from model_boss.cli.cluster import format_cluster

    record = member("gpu1", slots=(slot("m", active=1, queued=2),)).to_dict()
    record["gpus"] = [{"index": 0, "vram_mb": 24576}]
    text = format_cluster({"enabled": True, "host_id": "gpu1",
                           "members": [{**record, "self": True}],
                           "models": {"m": [{"host_id": "gpu1", "state": "ready",
                                             "tier": "gpu", "active": 1, "queued": 2,
                                             "parallel_free": 0}]}})
    assert "gpu1 *" in text and "0:24576MB" in text
    assert [line.split() for line in text.splitlines() if line.startswith("m ")] == [
        ["m", "gpu1", "ready", "gpu", "1", "2"]]
    assert "not a cluster member" in format_cluster({"enabled": False})


@pytest.mark.parametrize("status,body,retry,kind,code", [
    (503, b'{"error": {"message": "no", "type": "server_error", "param": null, '
          b'"code": "model_load_failed"}}', "7", "LoadFailed", "model_load_failed"),
    (503, b'{"error": {"message": "busy", "type": "server_error", "param": null, '
          b'"code": "queue_full"}}', "3", "ModelBossError", "queue_full"),
    (400, b'{"error": {"message": "bad", "type": "invalid_request_error", "param": "n", '
          b'"code": "invalid_request"}}', None, "ModelBossError", "invalid_request"),
    (502, b"<html>proxy error</html>", None, "ModelBossError", "upstream_error"),
])
def test_a_members_error_keeps_its_status_envelope_and_retry_after(status, body, retry,
                                                                    kind, code):
    from model_boss.services.clustered import member_error

    error = member_error(status, body, retry)
    assert type(error).__name__ == kind and error.status_code == status
    assert error.envelope()["error"]["code"] == code
    assert error.headers() == ({"Retry-After": retry} if retry else {})
    if status == 400:
        assert error.envelope()["error"]["type"] == "invalid_request_error"
        assert error.envelope()["error"]["param"] == "n"
