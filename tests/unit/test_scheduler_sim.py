"""The trace simulator runs the coordinator's own ordering and planner and keeps its
invariants."""

from __future__ import annotations

import json

import pytest

from model_boss.errors import BadRequest
from model_boss.simulation.side_by_side import simulate_side_by_side
from model_boss.simulation.simulator import (
    KNOWN_RATES,
    MODEL_BOSS,
    POLICIES,
    TODAY,
    SimRequest,
    Trace,
    simulate,
)
from model_boss.simulation.traces import bursty_trace, jsonl_trace, workshop_trace


def by_name(name):
    return next(p for p in POLICIES if p.name == name)


@pytest.mark.parametrize("trace", [workshop_trace(3, 120), bursty_trace(3, 120)],
                         ids=["workshop", "bursty"])
def test_invariants(trace):
    results = {p.name: simulate(trace, p) for p in POLICIES}
    for result in results.values():
        assert sum(len(w) for w in result.waits.values()) == len(trace.requests)
        assert result.peak_mb <= trace.capacity_mb
        assert all(w >= 0 for waits in result.waits.values() for w in waits)
    # Belady is the optimum among the FIFO policies
    assert results["belady"].cold_loads <= results["lru"].cold_loads
    assert results["belady"].cold_loads <= results["one-at-a-time"].cold_loads
    assert results["today"].inversions == 0


def test_aging_ends_starvation_on_the_bursty_trace():
    trace = bursty_trace(7)
    today, new = simulate(trace, TODAY), simulate(trace, MODEL_BOSS)
    assert sorted(new.waits) == [0, 5, 9]
    assert new.wait_pct(9, 0.95) * 5 < today.wait_pct(9, 0.95)


@pytest.mark.parametrize("seed", [7, 8])
def test_look_ahead_beats_today_against_belady(seed):
    trace = workshop_trace(seed)
    belady = simulate(trace, by_name("belady")).cold_loads
    assert simulate(trace, MODEL_BOSS).cold_loads <= 1.2 * belady
    assert simulate(trace, MODEL_BOSS).cold_loads < simulate(trace, TODAY).cold_loads


def test_jsonl_log(tmp_path):
    log = tmp_path / "log.jsonl"
    lines = [{"timestamp": 100 + i * 3, "model": m, "priority": p, "duration": 2,
              "size_mb": 9000, "client_id": f"c{i % 2}"}
             for i, (m, p) in enumerate([("a", 5), ("b", 5), ("a", 0), ("b", 9)] * 5)]
    log.write_text("\n".join(json.dumps(line) for line in lines))
    trace = jsonl_trace(log, capacity_mb=16384)
    assert trace.requests[0].arrival == 0 and trace.sizes == {"a": 9000, "b": 9000}
    assert {r.client for r in trace.requests} == {"c0", "c1"}
    assert simulate(trace, by_name("one-at-a-time")).cold_loads == 20


def test_a_bad_log_line_is_a_clear_error(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text('{"model": "a"}\n')
    with pytest.raises(BadRequest, match="log.jsonl:1"):
        jsonl_trace(log, capacity_mb=16384)


def test_simulate_command_prints_belady_waits_and_what_ifs(tmp_path, capsys):
    from model_boss.cli import main

    log = tmp_path / "requests.jsonl"
    rows = [{"timestamp": 50 + i * 4, "model": m, "priority": p, "duration": 3,
             "size_mb": 9000, "client_id": "c", "ok": True}
            for i, (m, p) in enumerate([("a", 0), ("b", 9), ("c", 5)] * 8)]
    log.write_text("\n".join(json.dumps(row) for row in rows))
    assert main(["simulate", "--trace", str(log), "--gpus", "16G", "--parallel", "2"]) == 0
    out = capsys.readouterr().out
    side = out.split("side by side (2 at once per loaded model")[1]
    assert {line.split()[0] for line in side.splitlines()[2:] if line.strip()} == {
        "today", "model-boss"}
    assert "24 requests, 3 models, 16384 MB" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert {"today", "model-boss", "belady"} <= set(lines)
    assert lines["belady"].split()[2] == "1.00"
    assert "p9 wait p50/p95 s" in out
    assert "keep-alive 60 s" in out and "VRAM 32768 MB" in out


@pytest.mark.parametrize("gpus, message", [("abc", "not a VRAM size"), ("0", "more than 0")])
def test_simulate_command_refuses_bad_input(tmp_path, capsys, gpus, message):
    from model_boss.cli import main

    log = tmp_path / "requests.jsonl"
    log.write_text('{"timestamp": 1, "model": "a", "duration": 1}\n')
    assert main(["simulate", "--trace", str(log), "--gpus", gpus]) == 2
    assert message in capsys.readouterr().out


def test_load_seconds_are_the_sum_of_the_cold_loads(tmp_path):
    log = tmp_path / "log.jsonl"
    lines = [{"timestamp": i * 3, "model": m, "duration": 1, "size_mb": 9000, "load_s": ls}
             for i, (m, ls) in enumerate([("a", 4.0), ("b", 7.0)] * 3)]
    log.write_text("\n".join(json.dumps(line) for line in lines))
    result = simulate(jsonl_trace(log, capacity_mb=16384), by_name("one-at-a-time"))
    assert result.cold_loads == 6 and result.load_s == pytest.approx(3 * 4.0 + 3 * 7.0)


def test_known_rates_runs_the_same_planner_with_the_trace_rates():
    trace = workshop_trace(15)
    learned, known = simulate(trace, MODEL_BOSS), simulate(trace, KNOWN_RATES)
    assert sum(len(w) for w in known.waits.values()) == len(trace.requests)
    assert known.peak_mb <= trace.capacity_mb
    # told the true rates, the cost-aware evictor spends fewer seconds loading on this trace
    assert known.load_s < learned.load_s


@pytest.mark.parametrize("parallel", [1, 4])
@pytest.mark.parametrize("trace", [workshop_trace(3, 120), bursty_trace(3, 120)],
                         ids=["workshop", "bursty"])
def test_side_by_side_invariants(trace, parallel):
    for policy in (TODAY, MODEL_BOSS):
        result = simulate_side_by_side(trace, policy, parallel)
        assert sum(len(w) for w in result.waits.values()) == len(trace.requests)
        assert result.peak_mb <= trace.capacity_mb
        assert all(w >= 0 for waits in result.waits.values() for w in waits)


def test_side_by_side_with_one_model_is_one_at_a_time():
    requests = [SimRequest(i * 0.5, "a", 5, 3.0, f"c{i}") for i in range(6)]
    trace = Trace("one model", requests, {"a": 4096}, 8192)
    alone, side = simulate(trace, MODEL_BOSS), simulate_side_by_side(trace, MODEL_BOSS, 1)
    assert side.cold_loads == alone.cold_loads == 1
    assert sorted(side.waits[5]) == pytest.approx(sorted(alone.waits[5]))


def test_side_by_side_models_share_the_gpu_and_batch_their_slots():
    # two loaded models, two requests each at once: alone each takes 4 s
    requests = [SimRequest(100.0, m, 5, 4.0, f"{m}{i}") for m in "ab" for i in range(2)]
    warm_up = [SimRequest(0.0, "a", 5, 1.0, "w"), SimRequest(0.0, "b", 5, 1.0, "w")]
    trace = Trace("two models", warm_up + requests, {"a": 4096, "b": 4096}, 8192,
                  load_s={"a": 2.0, "b": 2.0})
    one_slot = simulate_side_by_side(trace, MODEL_BOSS, parallel=1)
    two_slots = simulate_side_by_side(trace, MODEL_BOSS, parallel=2)
    assert one_slot.cold_loads == two_slots.cold_loads == 2
    # one slot each: the second request of a model waits for the first, which runs at half
    # speed beside the other model's (8 s); two slots each: nobody waits
    assert sorted(one_slot.waits[5])[-2:] == pytest.approx([8.0, 8.0])
    assert max(two_slots.waits[5][2:]) == pytest.approx(0.0)


def test_side_by_side_runs_only_planner_policies():
    with pytest.raises(ValueError, match="planner policies"):
        simulate_side_by_side(workshop_trace(3, 10), by_name("belady"))
