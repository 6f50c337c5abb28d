"""The scheduler's decisions, table-driven: eviction, placement, estimates, budgets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from model_boss.catalog import ModelManifest
from model_boss.gpu.estimate import estimate_vram, from_llama_fit, from_name
from model_boss.gpu.gguf_info import llama_fit, parse_fit_output
from model_boss.gpu.placement import LayerCosts, place, place_partial, place_split
from model_boss.scheduling.budget import Prediction, admit, predict
from model_boss.scheduling.eviction import SlotView, evict_candidates, victims_for
from model_boss.scheduling.learned import LearnedStats

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
    assert [s.key for s in evict_candidates(slots, incoming, NOW)] == expected


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
    assert (None if chosen is None else [v.key for v in chosen]) == expected


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
    found = estimate_vram(gguf, demo_gguf, fit_estimator=None)
    assert found.rung == "file" and 250 < found.mb < 320 and "KV" in found.detail
    bigger_ctx = estimate_vram(ModelManifest(id="m", path=str(demo_gguf), ctx_size=8192),
                               demo_gguf, fit_estimator=None)
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


def test_gguf_tables_are_the_packages_own_and_reading_a_header_loads_no_numpy(demo_gguf):
    """The header reader takes the gguf package's tables from ``gguf/constants.py`` alone; a
    coordinator that reads a header does not import the package (numpy, its writer)."""
    import gguf.constants

    from model_boss.catalog.gguf_header import gguf_tables

    code = ("import sys; from model_boss.gpu.gguf_info import read_gguf_info; "
            f"from model_boss.catalog.gguf_header import gguf_tables; info = read_gguf_info("
            f"__import__('pathlib').Path({str(demo_gguf)!r})); "
            "print(info.file_type, gguf_tables().LlamaFileType(info.file_type).name, "
            "'numpy' in sys.modules, 'gguf' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["3", "MOSTLY_Q4_1", "False", "False"], out
    # in a process that already imported the package, its own module is the one used
    assert gguf_tables.__wrapped__() is gguf.constants
    assert gguf_tables().GGML_QUANT_SIZES == gguf.constants.GGML_QUANT_SIZES


def kv_mb(demo_gguf, **fields) -> float:
    manifest = ModelManifest(id="m", path=str(demo_gguf), **fields)
    found = estimate_vram(manifest, demo_gguf, fit_estimator=None)
    return float(found.detail.split("KV (")[1].split(") ")[1].split(" MB")[0])


@pytest.mark.parametrize("fields, expected_mb", [
    ({"ctx_size": 4096}, 90),  # 30 layers x 4096 tokens x 3 KV heads x 64 x (2 + 2) bytes
    ({"ctx_size": 4096, "parallel": 4}, 90),  # the slots share ctx_size: no more KV
    ({"ctx_size": 8192, "parallel": 4}, 180),
    ({"ctx_size": 4096, "cache_type_k": "q8_0", "cache_type_v": "q8_0"}, 48),  # 34/32 B
    ({"ctx_size": 4096, "cache_type_k": "q8_0"}, 69),
    ({"ctx_size": 4096, "cache_type_k": "q4_0", "cache_type_v": "q4_0"}, 25),  # 18/32 B
])
def test_kv_cache_follows_ctx_and_cache_types_not_parallel(demo_gguf, fields, expected_mb):
    """llama.cpp's server holds ctx_size tokens for all its slots together (each slot gets
    ctx_size / parallel), at the cache types' bytes per element."""
    assert kv_mb(demo_gguf, **fields) == expected_mb


LLAMA_FIT_LOG = """\
0.00.003.780 I common_params_fit_impl: getting device memory data for initial parameters:
0.00.206.667 I common_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
0.00.206.668 I common_memory_breakdown_print: |   - CUDA0 (NVIDIA RTX 4090)  | 24080 = 20000 + ( 3300 =  3000 +     200 +     100) +     780 |
0.00.206.669 I common_memory_breakdown_print: |   - CUDA1 (NVIDIA RTX 4090)  | 24080 = 21000 + ( 2300 =  2000 +     200 +      80) +     780 |
0.00.206.720 I common_memory_breakdown_print: |   - Host               |                  400 =   380 +      0 +      20                |
0.00.228.095 I common_params_fit_impl: projected to use 5600 MiB of device memory vs. 41000 MiB of free device memory
0.00.228.096 I common_memory_breakdown_print: |   - Host               |                  999 =   999 +      0 +      0                |
"""  # noqa: E501


def test_llama_fit_output_is_read_from_the_first_breakdown_table():
    found = parse_fit_output(LLAMA_FIT_LOG)
    assert found is not None and not found.host_only
    assert found.devices == ("CUDA0 (NVIDIA RTX 4090)", "CUDA1 (NVIDIA RTX 4090)", "Host")
    assert (found.model_mb, found.context_mb, found.compute_mb) == (5380, 400, 200)
    assert parse_fit_output("no table here") is None


# a CPU-only build's table, as this project's xllamacpp prints it for the demo model (one
# Host row, no free or total figures before the sum)
LLAMA_FIT_CPU_LOG = """\
0.00.014.069 I common_params_fit_impl: getting device memory data for initial parameters:
0.02.364.611 I common_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
0.02.374.489 I common_memory_breakdown_print: |   - Host               |                  124 =    92 +      17 +      15                |
0.02.639.813 I common_params_fit_impl: projected to use 124 MiB of host memory vs. 24105 MiB of total host memory
/workspace/thirdparty/llama.cpp/src/llama-model.cpp:1883: GGML_ASSERT(!ml.no_alloc) failed
"""  # noqa: E501


def test_llama_fit_output_of_a_cpu_build_is_read_as_host_only():
    found = parse_fit_output(LLAMA_FIT_CPU_LOG)
    assert found is not None and found.host_only
    assert found.devices == ("Host",)
    assert (found.model_mb, found.context_mb, found.compute_mb) == (92, 17, 15)


@pytest.mark.slow
def test_llama_fit_reads_the_table_of_the_real_probe(demo_gguf, tmp_path):
    """The probe (``workers.llama --fit-only``, xllamacpp) on the demo model: a change in
    llama.cpp's table that the parser no longer reads fails here, not as a quiet fall back to
    the file's own estimate. Settings no other test asks for: answers are memoised."""
    found = llama_fit(demo_gguf, ctx_size=768, parallel=1, cache_type_k="f16",
                      cache_type_v="f16", flash_attn="auto", cache_file=tmp_path / "fit.json")
    assert found is not None, "llama.cpp's memory breakdown was not read from the probe"
    assert 50 < found.model_mb < 200 and found.context_mb > 0 and found.compute_mb > 0, found


def test_llama_fit_rung_uses_llama_cpp_figures_and_gpu_compute_on_a_cpu_build(demo_gguf,
                                                                              tmp_path):
    calls = []

    def probe(argv_tail):
        calls.append(argv_tail)
        return ("x common_memory_breakdown_print: |   - Host  |   130 =    92 +   22 +   16  |\n"
                "x common_params_fit_impl: projected to use 130 MiB of host memory\n")

    manifest = ModelManifest(id="m", path=str(demo_gguf), ctx_size=1000, parallel=2)
    fit = llama_fit(demo_gguf, ctx_size=1000, parallel=2, cache_type_k="f16",
                    cache_type_v="q8_0", flash_attn="auto", runner=probe,
                    cache_file=tmp_path / "fit.json")
    # None here is the parser failing on a CPU build's table (xllamacpp is always installed)
    assert fit is not None, "the CPU-only table the probe printed was not read"
    assert calls and calls[0][calls[0].index("--parallel") + 1] == "2"
    assert calls[0][calls[0].index("--cache-type-v") + 1] == "q8_0"
    again = llama_fit(demo_gguf, ctx_size=1000, parallel=2, cache_type_k="f16",
                      cache_type_v="q8_0", flash_attn="auto", runner=probe,
                      cache_file=tmp_path / "fit.json")
    assert again == fit and len(calls) == 1  # kept, not probed again
    found = estimate_vram(manifest, demo_gguf, fit_estimator=lambda m, p: from_llama_fit(
        m, p, probe=lambda *a, **k: fit))
    assert found.rung == "llama.cpp-fit" and "llama.cpp on Host" in found.detail
    # a CPU build's compute buffer is the CPU's: the GPU compute estimate stands in
    file_rung = estimate_vram(manifest, demo_gguf, fit_estimator=None)
    compute = int(found.detail.split("compute ")[1].split(" MB")[0])
    assert compute > 16 and "CPU figure 16 MB" in found.detail
    assert abs(compute - int(file_rung.detail.split("compute ")[1].split(" MB")[0])) <= 1
    assert found.mb == 92 + 22 + compute
    assert estimate_vram(ModelManifest(id="m", vram_mb=50), demo_gguf).rung == "manifest"


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


def costed(model_id, *, reload_s=0.0, rate=0.0, mb=1000, priority=5, last_used=0.0):
    return SlotView(model_id, "ready", False, 0, last_used, priority, NOW + 100, {0: mb},
                    reload_s=reload_s, rate_per_s=rate)


@pytest.mark.parametrize("case, slots, wanted, expected", [
    ("a model a waiting request needs goes last",
     [costed("next", last_used=1), costed("spare", last_used=2)], ["next"], ["spare", "next"]),
    ("of the wanted ones, the one needed latest goes first",
     [costed("first"), costed("second")], ["first", "second"], ["second", "first"]),
    ("every copy of a wanted model is wanted: a waiter may go to any",
     [costed("m#2", last_used=1), costed("spare", last_used=2)], ["m"], ["spare", "m#2"]),
    ("of a wanted model's copies, the usual order (least recently used first)",
     [costed("m", last_used=2), costed("m#2", last_used=1), costed("spare", last_used=3)],
     ["m"], ["spare", "m#2", "m"]),
    ("cheap to reload goes before costly (CPU tier vs disk)",
     [costed("disk", reload_s=20, rate=0.1, last_used=1), costed("cpu", reload_s=1, rate=0.1,
                                                               last_used=2)],
     [], ["cpu", "disk"]),
    ("rarely asked for goes before often asked for",
     [costed("hot", reload_s=5, rate=0.5, last_used=1), costed("cold", reload_s=5, rate=0.01,
                                                                last_used=2)],
     [], ["cold", "hot"]),
    ("without figures: least recently used",
     [costed("new", last_used=2), costed("old", last_used=1)], [], ["old", "new"]),
    ("priority still comes before cost",
     [costed("batch", reload_s=50, rate=1, priority=9), costed("mine", priority=5)], [],
     ["batch", "mine"]),
])
def test_look_ahead_and_cost_order(case, slots, wanted, expected):
    assert [s.key for s in evict_candidates(slots, 5, NOW, wanted)] == expected, case


@pytest.mark.parametrize("case, need, free, candidates, expected", [
    ("one big victim instead of three small ones ahead of it", 2500, {0: 600},
     [view("s1", gpu_mb={0: 500}), view("s2", gpu_mb={0: 500}), view("big", gpu_mb={0: 2000})],
     ["big"]),
    ("a prefix victim the later ones make unnecessary stays", 1500, {0: 600},
     [view("a", gpu_mb={0: 500}), view("b", gpu_mb={0: 500})], ["a", "b"]),
])
def test_victims_are_pruned(case, need, free, candidates, expected):
    assert [v.key for v in victims_for(need, free, candidates)] == expected, case


# --- a request's priority: its own, its client's, its task's, its model's, the default -----

@pytest.mark.parametrize("asked, client, task, model, expected", [
    (None, None, None, None, 7),     # nothing says: the default
    (None, None, None, 3, 3),        # the model's
    (None, None, 2, 3, 2),           # the task's over the model's
    (None, 1, 2, 3, 1),              # the client's over the task's
    (0, 1, 2, 3, 0),                 # the request's own over all, 0 included
    (None, 0, None, 9, 0),           # a client at 0 is not "unset"
    (9, None, None, 0, 9),           # a request may ask for less than its model's
    (None, "no profile", None, 4, 4),  # a client with no profile at all
])
def test_effective_priority(asked, client, task, model, expected):
    from model_boss.catalog.tasks import TaskSpec
    from model_boss.services.serving import effective_priority
    from model_boss.settings import ClientProfile, Settings

    settings = Settings(default_priority=7, manifests=[], tasks_file=None, use_nvml=False)
    profile = None if client == "no profile" else ClientProfile(priority=client)
    spec = TaskSpec(candidates=["m"], priority=task)
    manifest = ModelManifest(id="m", priority=model)
    assert effective_priority(settings, asked, profile, spec, manifest) == expected
