"""The scheduler's decisions, table-driven: eviction, placement, estimates, budgets."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_boss.catalog import ModelManifest
from model_boss.gpu.estimate import estimate_vram, from_name
from model_boss.gpu.placement import LayerCosts, place, place_partial, place_split
from model_boss.inference.budget import Prediction, admit, predict
from model_boss.inference.eviction import SlotView, evict_candidates, victims_for
from model_boss.inference.learned import LearnedStats

NOW = 1000.0


def view(model_id, *, state="ready", pinned=False, active=0, last_used=0.0, priority=5,
         unload_at=NOW + 100, gpu_mb=None):
    return SlotView(model_id, state, pinned, active, last_used, priority, unload_at,
                    gpu_mb if gpu_mb is not None else {0: 1000})


@pytest.mark.parametrize("slots, incoming, expected", [
    # least important first, then least recently used
    ([view("a", priority=5, last_used=1), view("b", priority=9, last_used=2)], 5, ["b", "a"]),
    ([view("a", last_used=2), view("b", last_used=1)], 5, ["b", "a"]),
    # expired slots go first, whatever their priority
    ([view("a", priority=9), view("b", priority=0, unload_at=NOW - 1)], 5, ["b", "a"]),
    # a more important idle slot is kept inside its stay-warm ...
    ([view("a", priority=0)], 9, []),
    # ... but an equally important request may take it
    ([view("a", priority=0)], 0, ["a"]),
    # pinned, busy, loading and idle slots are never candidates
    ([view("p", pinned=True, unload_at=NOW - 1), view("busy", active=1, priority=9),
      view("l", state="loading", priority=9), view("i", state="idle", priority=9)], 5, []),
    # offloaded slots are candidates (they hold RAM, not VRAM)
    ([view("o", state="offloaded", gpu_mb={})], 5, ["o"]),
    # keep-alive -1 (unload_at None): only priority decides
    ([view("forever", unload_at=None, priority=5)], 5, ["forever"]),
])
def test_evict_candidates(slots, incoming, expected):
    assert [s.model_id for s in evict_candidates(slots, incoming, NOW)] == expected


@pytest.mark.parametrize("need, free, candidates, split, expected", [
    (500, {0: 600}, [view("a")], False, []),                      # fits already
    (1500, {0: 600}, [view("a"), view("b")], False, ["a"]),       # one eviction is enough
    (2500, {0: 600}, [view("a"), view("b")], False, ["a", "b"]),
    (5000, {0: 600}, [view("a"), view("b")], False, None),        # never enough
    (1500, {0: 600, 1: 0}, [view("x", gpu_mb={1: 1000})], False, None),  # wrong GPU
    (1500, {0: 600, 1: 0}, [view("x", gpu_mb={1: 1000})], True, ["x"]),  # ... unless split
    (1500, {0: 600}, [view("o", state="offloaded", gpu_mb={}), view("a")], False, ["a"]),
])
def test_victims_for(need, free, candidates, split, expected):
    chosen = victims_for(need, free, candidates, allow_split=split)
    assert (None if chosen is None else [v.model_id for v in chosen]) == expected


@pytest.mark.parametrize("need, free, kind, allocations", [
    (1000, {0: 2000, 1: 3000}, "single", {1: 1000}),         # the GPU with most free
    (1000, {0: 3000, 1: 3000}, "single", {0: 1000}),         # ties go to the lower index
    (4000, {0: 2000, 1: 3000}, "split", {0: 1600, 1: 2400}),  # proportional to free
    (300, {0: 100, 1: 100, 2: 100}, "split", {0: 100, 1: 100, 2: 100}),
    (6000, {0: 2000, 1: 3000}, None, None),                   # does not fit at all
])
def test_place(need, free, kind, allocations):
    placement = place(need, free)
    if kind is None:
        assert placement is None
    else:
        assert placement.kind == kind and placement.allocations == allocations
        assert sum(placement.allocations.values()) == need


def test_split_ratios_and_visible_devices():
    placement = place_split(4000, {0: 2000, 1: 0, 2: 3000})
    assert placement.gpus == [0, 2] and placement.cuda_visible_devices == "0,2"
    assert placement.tensor_split == (0.4, 0.6)
    assert place(4000, {0: 2000, 2: 3000}, allow_split=False) is None


@pytest.mark.parametrize("free, costs, layers", [
    ({0: 1000}, LayerCosts(100, 300, 30), 7),          # (1000 - 300) // 100
    ({0: 1000, 1: 1500}, LayerCosts(100, 300, 30), 12),  # the roomier GPU
    ({0: 350}, LayerCosts(100, 300, 30), None),        # not even one layer
    ({0: 1000}, LayerCosts(100, 300, 30, min_gpu_layers=8), None),  # below the minimum
    ({0: 9999}, LayerCosts(100, 300, 30), 29),         # never "all" (that is a full fit)
])
def test_place_partial(free, costs, layers):
    placement = place_partial(free, costs)
    if layers is None:
        assert placement is None
    else:
        assert placement.kind == "partial" and placement.gpu_layers == layers
        assert placement.total_layers == 30
        assert placement.share == f"{100 - round(100 * layers / 30)}%/" \
                                  f"{round(100 * layers / 30)}% CPU/GPU"


def test_estimate_chain_rungs(tmp_path, demo_gguf):
    gguf = ModelManifest(id="m", path=str(demo_gguf), ctx_size=1024)
    found = estimate_vram(gguf, demo_gguf)
    assert found.rung == "file" and 250 < found.mb < 320 and "KV" in found.detail
    bigger_ctx = estimate_vram(ModelManifest(id="m", path=str(demo_gguf), ctx_size=8192),
                               demo_gguf)
    assert bigger_ctx.mb > found.mb
    assert estimate_vram(gguf, demo_gguf, measured_mb=321).rung == "measured"
    assert estimate_vram(ModelManifest(id="m", vram_mb=777), demo_gguf).mb == 777
    blob = tmp_path / "weights.gguf"
    blob.write_bytes(b"not really gguf" * 1000)
    size = estimate_vram(ModelManifest(id="m", path=str(blob)), blob)
    assert size.rung == "file_size" and size.mb == int(15000 * 1.1 / 2**20) + 1
    named = estimate_vram(ModelManifest(id="llama-7b-q4_k_m", path="missing.gguf"),
                          Path("/nonexistent/missing.gguf"))
    assert named.rung == "name" and 4000 < named.mb < 6000
    assert estimate_vram(ModelManifest(id="mystery"), None).rung == "default"
    assert from_name("no-size-here") is None


def test_safetensors_headers(tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(1024, 1024)}, tmp_path / "model.safetensors")
    found = estimate_vram(ModelManifest(id="m", path=str(tmp_path)), tmp_path)
    assert found.rung == "file" and found.mb == int(4 * 2**20 * 1.2 / 2**20) + 1


@pytest.mark.parametrize("warm, loading, ahead, budget, admitted", [
    (True, False, 0, 1.0, True),     # warm: inference only
    (False, False, 0, 0.05, False),  # cold: the load alone is over budget
    (False, False, 0, 10, True),
    (False, True, 0, 2.0, True),     # a load under way: half of it is left
    (True, False, 8, 3.0, False),    # eight ahead at 0.5 s each, one at a time
    (True, False, 8, 3.0, False),
    (True, False, 2, 3.0, True),
    (True, False, 0, None, True),    # no budget, no refusal
])
def test_budget_admission(warm, loading, ahead, budget, admitted):
    prediction = predict(warm=warm, loading=loading, ahead=ahead, parallel=1, load_s=3.0,
                         infer_s=0.5)
    decision = admit(budget, prediction)
    assert decision.admitted is admitted
    if not admitted:
        assert decision.retry_after_s >= 1 and "exceeds" in decision.reason


def test_parallel_slots_shorten_the_wait():
    assert predict(warm=True, loading=False, ahead=8, parallel=4, load_s=0,
                   infer_s=1).wait_s == 2
    assert Prediction(1, 2, 3).total_s == 6


def test_learned_stats_ewma_and_persistence(tmp_path):
    stats = LearnedStats(tmp_path / "learned.json")
    assert stats.predicted_load_s("m", 2000) == 2.0  # 1 s + 2000 MB at 2000 MB/s
    stats.observe_load("m", 10.0)
    stats.observe_load("m", 20.0)
    assert stats.get("m").load_s == pytest.approx(13.0)
    stats.observe_inference("m", 1.0)
    stats.observe_vram("m", 5000)
    stats.flush()  # writes are throttled; shutdown flushes
    again = LearnedStats(tmp_path / "learned.json")
    again.load()
    assert again.get("m").load_s == pytest.approx(13.0) and again.get("m").vram_mb == 5000
    assert again.predicted_infer_s("m") == 1.0
