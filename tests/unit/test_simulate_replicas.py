"""One model's requests over its replicas: the real scale_up decision, replayed."""

import json

import pytest

from model_boss.simulation.replicas import (
    ReplicaSettings,
    busiest_model,
    requests_of,
    simulate_replicas,
)
from model_boss.simulation.traces import burst_trace

FIRST = [(0.0, 1.0)]  # loads the first copy (ready at 10), served 10..11
BURST = [(20.0, 5.0)] * 6  # six at once while the first copy is idle


def settings(**kw):
    return ReplicaSettings(**{"load_s": 10.0, "keep_alive_s": 300.0, "wait_s": 2.0, **kw})


@pytest.mark.parametrize("max_replicas, starts, waits", [
    (1, [0.0], [10.0, 0.0, 5.0, 10.0, 15.0, 20.0, 25.0]),
    # the first waiter has waited 2 s at 22: one more copy, READY at 32, serving from then
    (2, [0.0, 22.0], [10.0, 0.0, 5.0, 10.0, 12.0, 15.0, 17.0]),
])
def test_a_burst_gets_a_second_copy_once_its_first_waiter_waited(max_replicas, starts, waits):
    result = simulate_replicas(FIRST + BURST, settings(max_replicas=max_replicas))
    assert result.starts == starts
    assert result.waits == waits
    assert result.peak == max_replicas


def test_requests_that_never_wait_the_threshold_get_no_second_copy():
    pairs = [(20.0 + 10 * k + d, 1.5) for k in range(5) for d in (0.0, 1.0)]
    result = simulate_replicas(FIRST + pairs, settings(max_replicas=4))
    assert result.starts == [0.0]
    assert max(result.waits[1:]) == 0.5


def test_below_min_starts_the_copies_at_once():
    result = simulate_replicas([(0.0, 5.0), (0.0, 5.0)], settings(min_replicas=2,
                                                                  max_replicas=3))
    assert result.starts == [0.0, 0.0]
    assert result.waits == [10.0, 10.0]
    assert result.peak == 2


@pytest.mark.parametrize("min_replicas, starts, copy_s", [
    # each copy: a 10 s load, 5 s serving, 30 s idle; the late request loads one again
    (1, [0.0, 10.0, 1000.0], 45.0 * 3),
    (2, [0.0, 0.0, 1000.0, 1000.0], 45.0 * 3 + 40.0),  # the unused one: load, 30 s idle
])
def test_idle_copies_go_after_their_keep_alive_the_first_one_too(min_replicas, starts,
                                                                 copy_s):
    requests = [(0.0, 5.0), (0.0, 5.0), (1000.0, 5.0)]
    result = simulate_replicas(requests, settings(min_replicas=min_replicas, max_replicas=2,
                                                  keep_alive_s=30.0))
    assert result.starts == starts
    assert result.copy_s == copy_s


def test_a_copy_runs_parallel_requests_at_once():
    result = simulate_replicas(FIRST + BURST[:2], settings(max_replicas=2, parallel=2))
    assert result.starts == [0.0]
    assert result.waits == [10.0, 0.0, 0.0]


def test_the_replay_is_deterministic():
    trace = burst_trace(seed=3)
    requests = requests_of(trace, busiest_model(trace))
    runs = [simulate_replicas(r, settings(max_replicas=3))
            for r in (requests, list(requests), list(reversed(requests)))]
    assert runs[0] == runs[1] == runs[2]
    assert len(runs[0].waits) == len(requests)


def test_more_copies_cut_the_waits_of_a_burst_for_more_copy_seconds():
    trace = burst_trace(seed=1)
    requests = requests_of(trace, "chat")
    one, two = (simulate_replicas(requests, settings(max_replicas=n)) for n in (1, 2))
    assert two.wait_pct(0.5) < one.wait_pct(0.5) / 2
    assert two.copy_s > one.copy_s and two.started == 2


def test_settings_out_of_range_are_refused():
    with pytest.raises(ValueError, match="min <= max"):
        ReplicaSettings(min_replicas=3, max_replicas=2)


def test_simulate_replicas_command_prints_one_row_per_maximum(tmp_path, capsys):
    from model_boss.cli import main

    assert main(["simulate", "--replicas", "3"]) == 0
    out = capsys.readouterr().out
    assert "burst (seed 1): 300 requests for chat" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["1", "2", "3"]
    assert rows[0][4] == "1.00" and float(rows[1][4]) < 1.0

    log = tmp_path / "requests.jsonl"
    log.write_text("\n".join(json.dumps({"timestamp": 100 + i, "model": m, "duration": 4,
                                         "size_mb": 4096, "load_s": 5})
                             for i, m in enumerate(["a", "b", "b"] * 5)))
    assert main(["simulate", "--trace", str(log), "--replicas", "2"]) == 0
    assert "10 requests for b, load 5.0 s" in capsys.readouterr().out
    assert main(["simulate", "--trace", str(log), "--replicas", "2", "--model", "x"]) == 2
    assert "no requests for 'x'" in capsys.readouterr().out
    assert main(["simulate", "--gpus", "24G"]) == 2
    assert "--trace and --gpus are needed" in capsys.readouterr().out
