"""The trace simulator runs the real decision functions and keeps its invariants."""

from __future__ import annotations

import json

import pytest

from benchmarks.scheduler_sim import (
    POLICIES,
    bursty_trace,
    jsonl_trace,
    simulate,
    workshop_trace,
)


@pytest.mark.parametrize("trace", [workshop_trace(3, 120), bursty_trace(3, 120)],
                         ids=["workshop", "bursty"])
def test_invariants(trace):
    results = {p: simulate(trace, p) for p in POLICIES}
    for result in results.values():
        assert sum(len(w) for w in result.waits.values()) == len(trace.requests)
        assert result.peak_mb <= trace.capacity_mb
        assert all(w >= 0 for waits in result.waits.values() for w in waits)
    # Belady is the optimum among the FIFO policies
    assert results["belady"].cold_loads <= results["lru"].cold_loads
    assert results["belady"].cold_loads <= results["one-at-a-time"].cold_loads
    assert results["model-boss"].inversions == 0


def test_priorities_shape_waits():
    result = simulate(bursty_trace(5, 200), "model-boss")
    assert sorted(result.waits) == [0, 5, 9]
    assert max(result.waits[0]) <= max(result.waits[9])


def test_jsonl_log(tmp_path):
    log = tmp_path / "log.jsonl"
    lines = [{"timestamp": 100 + i * 3, "model": m, "priority": p, "duration": 2,
              "size_mb": 9000}
             for i, (m, p) in enumerate([("a", 5), ("b", 5), ("a", 0), ("b", 9)] * 5)]
    log.write_text("\n".join(json.dumps(line) for line in lines))
    trace = jsonl_trace(log, capacity_mb=16384)
    assert trace.requests[0].arrival == 0 and trace.sizes == {"a": 9000, "b": 9000}
    assert simulate(trace, "one-at-a-time").cold_loads == 20
