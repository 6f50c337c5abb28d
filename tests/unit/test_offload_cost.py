"""What a model with only some of its layers on the GPU costs, and how its loads keep to it:
the VRAM estimate of the resident layers (gpu/estimate.resident, placed), the layer count its
learned figures are kept by (placement.partial_layers, scheduling/learned.py) and a budget
reads, the count lowered once when a load finds less VRAM than planned
(placement.fewer_layers, slots/loading.py), and a parked worker's plan kept. Tables over the
pure functions; the loads through the coordinator on a declared GPU, with in-process
backends (tests/unit/fakes.py) over a folder whose safetensors headers say the sizes."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import yaml

from model_boss.catalog.manifest import ModelManifest
from model_boss.coordinator import Coordinator
from model_boss.gpu.estimate import VramEstimate, estimate_vram, placed, resident
from model_boss.gpu.placement import (
    LayerCosts,
    Placement,
    fewer_layers,
    fixed_layers,
    layers_on_gpu,
    partial_layers,
    place_partial,
)
from model_boss.gpu.safetensors_info import BlockLayout, layer_costs_mb, model_layers
from model_boss.scheduling.budget import admit, may_run_in_layers, placed_layers, predict
from model_boss.scheduling.learned import LearnedStats, nearest
from model_boss.services import run_job
from model_boss.settings import Settings

from .fakes import FakeBackend, started_client

MB = 2**20
LAYERS = 8


def headers_only(folder: Path, sizes: dict[str, int]) -> Path:
    """A safetensors file whose header declares tensors of ``sizes`` bytes (no data: a reader
    of sizes reads the header alone)."""
    folder.mkdir(parents=True, exist_ok=True)
    header, offset = {}, 0
    for name, size in sizes.items():
        header[name] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    return folder


def decoder(folder: Path) -> Path:
    """Eight 100 MB layers with attention, 200 MB of other weights (1000 MB in all)."""
    sizes = {f"model.layers.{i}.self_attn.q_proj.weight": 100 * MB for i in range(LAYERS)}
    return headers_only(folder, {**sizes, "model.embed_tokens.weight": 200 * MB})


# with prefetch: 120 MB a resident layer (100 x 1.2), 440 MB whatever the count
# (200 x 1.2 other weights + two 100 MB layers staged)
COSTS = LayerCosts(120.0, 440.0, LAYERS)


def test_the_costs_of_the_decoder(tmp_path):
    layout = model_layers(decoder(tmp_path / "m"))
    assert layer_costs_mb(layout, prefetch=True) == pytest.approx((120.0, 440.0))
    assert layer_costs_mb(layout, prefetch=False) == pytest.approx((120.0, 340.0))


# (the manifest's fields) -> the estimate's MB, rung, what its detail says, the whole's MB
ESTIMATES = [
    ({}, 1201, "file", "safetensors headers", None),  # every layer: the whole model
    ({"gpu_layers": -1}, 1201, "file", "safetensors headers", None),
    ({"gpu_layers": LAYERS}, 1201, "file", "safetensors headers", None),
    ({"gpu_layers": 20}, 1201, "file", "safetensors headers", None),  # more than it has
    ({"gpu_layers": 5}, 440 + 5 * 120 + 1, "file",
     "5 of 8 layers on the GPU, 3 streamed from CPU RAM: other weights 240 MB + 5 layers "
     "600 MB (weights x1.2 for activations) + staging for 2 layers (prefetch) 200 MB; "
     "the whole model: 1201 MB", 1201),
    ({"gpu_layers": 5, "offload_prefetch": False}, 340 + 5 * 120 + 1, "file",
     "staging for 1 layer 100 MB", 1201),
    ({"gpu_layers": 0}, 441, "file", "0 of 8 layers on the GPU", 1201),
    # the manifest's word, and a figure measured at that count, stand as they are
    ({"gpu_layers": 5, "vram_mb": 3000}, 3000, "manifest", "vram_mb", None),
]


@pytest.mark.parametrize("fields, mb, rung, says, whole", ESTIMATES)
def test_a_manifests_count_is_estimated_at_its_resident_layers(tmp_path, fields, mb, rung,
                                                                says, whole):
    folder = decoder(tmp_path / "m")
    manifest = ModelManifest(id="m", backend="transformers", category="tts",
                             path=str(folder), **fields)
    found = estimate_vram(manifest, folder)
    assert (found.mb, found.rung, found.whole_mb) == (mb, rung, whole)
    assert says in found.detail
    if whole is not None:  # the rule the planner's partial placement leases by
        assert found.mb == COSTS.mb(fields["gpu_layers"]) or not fields.get(
            "offload_prefetch", True)


def test_a_count_measured_stands_and_other_backends_keep_the_whole(tmp_path):
    folder = decoder(tmp_path / "m")
    voice = ModelManifest(id="m", backend="transformers", category="tts", path=str(folder),
                          gpu_layers=5)
    assert estimate_vram(voice, folder, measured_mb=777) == VramEstimate(
        777, "measured", "reported after a previous load")
    gguf = ModelManifest(id="m", path=str(folder), gpu_layers=5)  # llama.cpp's own count
    assert estimate_vram(gguf, folder, fit_estimator=None).whole_mb is None


WHOLE = VramEstimate(1201, "file", "safetensors headers 1000 MB x 1.2")
LAYOUT = BlockLayout("model.layers", (100 * MB,) * LAYERS, 200 * MB)


@pytest.mark.parametrize("estimate, placement, layout, mb, whole_mb, says", [
    (WHOLE, None, LAYOUT, 1201, None, "headers"),
    (WHOLE, Placement({0: 1201}, "single"), LAYOUT, 1201, None, "headers"),
    (WHOLE, Placement({0: 921}, "partial", gpu_layers=4, total_layers=8), LAYOUT, 921, 1201,
     "4 of 8 layers on the GPU"),
    # measured whole, placed partly: the resident layers from the headers
    (VramEstimate(1500, "measured"), Placement({0: 921}, "partial", gpu_layers=4,
                                               total_layers=8), LAYOUT, 921, 1500,
     "the whole model: 1500 MB"),
    # a manifest's 5 placed at 3: the whole is the whole's, not the 5 layers'
    (resident(WHOLE, LAYOUT, 5, True), Placement({0: 801}, "partial", gpu_layers=3,
                                                  total_layers=8), LAYOUT, 801, 1201,
     "3 of 8 layers"),
    # a GGUF: what the partial placement leases
    (WHOLE, Placement({0: 700}, "partial", gpu_layers=10, total_layers=30), None, 700, 1201,
     "10 of 30 layers on the GPU, the rest on the CPU"),
])
def test_the_slots_estimate_as_placed(estimate, placement, layout, mb, whole_mb, says):
    found = placed(estimate, placement, layout, prefetch=True)
    assert (found.mb, found.whole_mb) == (mb, whole_mb) and says in found.detail


@pytest.mark.parametrize("wanted, layers", [("auto", None), (-1, None), (0, 0), (12, 12)])
def test_fixed_layers(wanted, layers):
    assert fixed_layers(wanted) == layers


# (placement, the manifest's gpu_layers) -> the count the learned figures are kept by
PARTIAL = [
    (None, 12, None),  # no GPU: whole on the CPU
    (Placement({}, "single"), 12, None),
    (Placement({0: 100}, "single"), "auto", None),  # every layer on the GPU
    (Placement({0: 100}, "single"), -1, None),
    (Placement({0: 100}, "single"), 12, 12),  # the manifest's count
    (Placement({0: 100}, "partial", gpu_layers=20, total_layers=28), "auto", 20),
    (Placement({0: 100}, "partial", gpu_layers=20, total_layers=28), 24, 20),  # placed lower
    (Placement({0: 100}, "partial", gpu_layers=28, total_layers=28), "auto", None),
]


@pytest.mark.parametrize("placement, wanted, layers", PARTIAL)
def test_the_count_a_model_runs_with(placement, wanted, layers):
    assert partial_layers(placement, wanted) == layers
    assert placed_layers(ModelManifest(id="m", gpu_layers=wanted), None, placement) == layers
    if placement is not None:  # a copy's own placement before a plan's
        assert placed_layers(ModelManifest(id="m", gpu_layers=wanted), placement, Placement(
            {0: 1}, "partial", gpu_layers=1, total_layers=99)) == layers


@pytest.mark.parametrize("fields, may", [
    ({}, False), ({"gpu_layers": -1}, False), ({"allow_partial": True}, True),
    ({"gpu_layers": 0}, True), ({"gpu_layers": 20}, True),
])
def test_which_models_may_run_in_layers(fields, may):
    assert may_run_in_layers(ModelManifest(id="m", **fields)) is may


@pytest.mark.parametrize("free, costs, layers", [
    ({0: 1000}, COSTS, 4),                             # (1000 - 440) // 120
    ({0: 9999}, COSTS, 7),                             # never all
    ({0: 9999}, LayerCosts(120.0, 440.0, 8, max_gpu_layers=5), 5),  # a manifest's count
    ({0: 1000}, LayerCosts(120.0, 440.0, 8, max_gpu_layers=5), 4),
])
def test_a_manifests_count_caps_the_partial_placement(free, costs, layers):
    assert place_partial(free, costs).gpu_layers == layers


# (layers now, lease MB, room the GPU has) -> the layers it goes on with, or None
FEWER = [
    (4, 921, 736, 2),     # a quarter short: (736 - 440) // 120
    (4, 921, 921, 3),     # room for all four still: one fewer, the least it lowers
    (4, 921, 5000, 3),    # the lease bounds the room, never more than it
    (4, 921, 500, None),  # not one layer's room
    (1, 561, 561, None),  # one layer: none fewer but none
    (8, 1401, 1100, 5),   # the whole model (a manifest's count of all) lowered
]


@pytest.mark.parametrize("now, leased, room, layers", FEWER)
def test_the_layers_that_fit_what_was_found(now, leased, room, layers):
    placement = Placement({0: leased}, "partial", gpu_layers=now, total_layers=LAYERS)
    lowered = fewer_layers(placement, now, COSTS, {0: room}, "out of memory")
    if layers is None:
        assert lowered is None
        return
    assert lowered.gpu_layers == layers and lowered.allocations == {0: leased}
    assert lowered.notes == [f"{layers}/8 layers on GPU 0, lowered from {now}: out of memory"]


def test_fewer_layers_keeps_the_minimum_and_one_gpu():
    placement = Placement({0: 921}, "partial", gpu_layers=4, total_layers=LAYERS)
    at_least_3 = LayerCosts(120.0, 440.0, LAYERS, min_gpu_layers=3)
    assert fewer_layers(placement, 4, at_least_3, {0: 736}, "x") is None  # 2 < 3
    assert fewer_layers(placement, 4, at_least_3, {0: 900}, "x").gpu_layers == 3
    split = Placement({0: 500, 1: 500}, "split")
    assert fewer_layers(split, 8, COSTS, {0: 500, 1: 500}, "x") is None


# (observations as (seconds, work, layers)), asked (work, layers) -> predicted seconds
LEARNED = [
    ([(1.0, None, None)], (None, None), 1.0),
    ([(1.0, None, None), (4.0, None, 20)], (None, 20), 4.0),  # each count its own
    ([(1.0, None, None), (4.0, None, 20)], (None, None), 1.0),
    ([(2.0, 100, None), (6.0, 100, 20)], (50, 20), 3.0),  # per token at 20 layers
    ([(2.0, 100, None), (6.0, 100, 20)], (50, None), 1.0),
    ([(4.0, None, 20), (8.0, None, 12)], (None, 16), 8.0),  # as close: the fewer (slower)
    ([(4.0, None, 20), (8.0, None, 12)], (None, 18), 4.0),
    ([(1.0, None, None), (4.0, None, 20)], (None, 8), 4.0),  # never ran at 8: nearest
    ([(1.0, None, None)], (None, 8), 1.0),  # never partly: the whole's
    ([(4.0, None, 20), (8.0, None, 12)], (None, None), 4.0),  # never whole: the most layers
    ([], (10, 20), 0.0),
]


@pytest.mark.parametrize("seen, asked, seconds", LEARNED)
def test_inference_is_learned_at_each_layer_count(seen, asked, seconds):
    learned = LearnedStats()
    for took, work, layers in seen:
        learned.observe_inference("m", took, work, layers)
    assert learned.predicted_infer_s("m", *asked) == pytest.approx(seconds)


@pytest.mark.parametrize("counts, layers, found", [
    ([], 5, None), ([20, 12], None, 20), ([20, 12], 16, 12), ([20, 12], 28, 20),
])
def test_nearest(counts, layers, found):
    assert nearest(counts, layers) == found


def test_vram_and_times_by_count_persist(tmp_path):
    learned = LearnedStats(tmp_path / "learned.json")
    learned.observe_inference("m", 0.2, 10)
    learned.observe_inference("m", 1.3, 10, layers=20)
    learned.observe_vram("m", 14000)
    learned.observe_vram("m", 9500, layers=20)
    learned.flush()
    again = LearnedStats(tmp_path / "learned.json")
    again.load()
    assert again.measured_vram("m") == 14000 and again.measured_vram("m", 20) == 9500
    assert again.measured_vram("m", 12) is None and again.measured_vram("other") is None
    assert again.predicted_infer_s("m", 10, 20) == pytest.approx(1.3)
    assert again.predicted_infer_s("m", 10) == pytest.approx(0.2)
    assert again.get("m").requests == 1 and again.get("m").layers[20].requests == 1


def test_a_budget_reads_the_time_at_the_count_placed():
    learned = LearnedStats()
    learned.observe_inference("m", 0.2 * 50, 50)              # whole: 0.2 s a token
    learned.observe_inference("m", 1.3 * 50, 50, layers=20)   # 20 of 28: 1.3 s a token

    def decision(layers):
        infer = learned.predicted_infer_s("m", 40, layers)
        return admit(20.0, predict(warm=True, loading=False, ahead=0, parallel=1, load_s=0,
                                   infer_s=infer))
    assert decision(None).admitted  # 8 s
    refused = decision(20)          # 52 s
    assert not refused.admitted and "inference 52.00s" in refused.reason


# -- loads, through the coordinator -------------------------------------------------------

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 100.00 MiB"


class LayeredBackend(FakeBackend):
    """A transformers worker as the pool sees it: the layers it was started with, reported
    as its /health does; ``reports``: the CUDA figures its reports give, one per report."""

    can_offload = True

    def __init__(self, *args, reports: list[dict] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reports = reports if reports is not None else []
        self.layers: tuple[int | None, int] = (None, LAYERS)

    def gpu_layers(self, placement) -> int:
        return layers_on_gpu(placement, self.entry.manifest.gpu_layers)

    async def start(self, port, placement) -> None:
        await super().start(port, placement)
        count = self.gpu_layers(placement)
        self.layers = (count if 0 <= count < LAYERS else None, LAYERS)
        self.log.append(("layers", self.layers[0]))

    async def report(self) -> dict:
        memory = self.reports.pop(0) if self.reports else {}
        return {"memory": memory, "gpu_layers": self.layers[0], "total_layers": self.layers[1]}


def layered(tmp_path: Path, gpu_mb: int, *, fail_starts=None, reports=None, **fields):
    folder = decoder(tmp_path / "voice")
    manifest = {"id": "voice", "backend": "transformers", "category": "embedding",
                "path": str(folder), "allow_partial": True, **fields}
    (tmp_path / "manifests.yaml").write_text(yaml.safe_dump([manifest]))
    log: list = []
    settings = Settings(manifests=[tmp_path / "manifests.yaml"], tasks_file=None,
                        state_dir=tmp_path / "state", models_dir=tmp_path / "models",
                        gpus=[{"index": 0, "name": "sim", "vram_mb": gpu_mb}],
                        vram_margin_mb=0, use_nvml=False, reclaim_sleep_s=0,
                        spare_workers=False)
    coord = Coordinator(settings, job_work=run_job, backend_factory=lambda entry, s:
                        LayeredBackend(entry, s, log, fail_starts=fail_starts,
                                       reports=reports))
    return coord, log


def embed() -> dict:
    return {"model": "voice", "input": "a cat"}


async def served(coord) -> tuple[int, dict, list[dict]]:
    async with started_client(coord) as client:
        answer = await client.post("/v1/embeddings", json=embed())
        status = (await client.get("/api/v1/status")).json()
        events = (await client.get("/api/v1/events?stream=false")).json()["events"]
    return answer.status_code, status, events


def slot_of(status: dict) -> dict:
    return next(s for s in status["slots"] if s["model"] == "voice")


async def test_a_partial_placement_leases_and_shows_the_resident_layers(tmp_path):
    coord, log = layered(tmp_path, 1000)  # the whole (1201 MB) does not fit: 4 layers do
    code, status, _ = await served(coord)
    assert code == 200 and ("layers", 4) in log
    slot = slot_of(status)
    assert slot["placement"]["gpu_layers"] == 4 and status["gpus"][0]["leased_mb"] == 921
    estimate = slot["vram_estimate"]
    assert (estimate["mb"], estimate["whole_mb"], estimate["rung"]) == (921, 1201, "file")
    assert estimate["detail"].startswith("4 of 8 layers on the GPU, 4 streamed from CPU RAM")
    assert slot["processor"]["size_mb"] == 1201 and slot["processor"]["gpu_layers"] == 4


async def test_a_manifests_count_leases_its_resident_layers_and_is_lowered_to_fit(tmp_path):
    coord, log = layered(tmp_path, 4000, gpu_layers=5)
    code, status, events = await served(coord)
    assert code == 200 and ("layers", 5) in log
    assert status["gpus"][0]["leased_mb"] == COSTS.mb(5)  # not the whole model's 1201
    assert not [e for e in events if e["type"] == "layers_lowered"]
    # a GPU with room for 3 of its 5: the planner places 3 and the load says so
    coord, log = layered(tmp_path / "small", 850, gpu_layers=5)
    code, status, events = await served(coord)
    assert code == 200 and ("layers", 3) in log
    lowered = next(e for e in events if e["type"] == "layers_lowered")
    assert (lowered["from_layers"], lowered["to_layers"], lowered["total_layers"]) == (5, 3, 8)
    assert "less free VRAM than 5 layers need" in lowered["reason"]
    assert slot_of(status)["vram_estimate"]["mb"] == COSTS.mb(3)


async def test_out_of_memory_while_loading_lowers_the_layers_once_in_the_same_lease(tmp_path,
                                                                                 caplog):
    coord, log = layered(tmp_path, 1000, fail_starts=[RuntimeError(OOM)])
    code, status, events = await served(coord)
    assert code == 200, status
    assert "voice: 4 layers on the GPU lowered to 2 of 8: out of memory while loading" in \
        caplog.text
    # planned 4 layers in 921 MB; a quarter short, 736 MB hold 2: started again with 2
    assert [entry for entry in log if entry[0] in ("start", "layers")] == [
        ("start", "voice"), ("start", "voice"), ("layers", 2)]
    lowered = next(e for e in events if e["type"] == "layers_lowered")
    assert (lowered["from_layers"], lowered["to_layers"]) == (4, 2)
    assert "out of memory while loading" in lowered["reason"]
    assert not [e for e in events if e["type"] in ("oom_retry", "load_failed")]
    slot = slot_of(status)
    assert slot["state"] == "ready" and slot["placement"]["gpu_layers"] == 2
    assert "lowered from 4" in slot["placement"]["notes"][-1]
    assert status["gpus"][0]["leased_mb"] == 921  # the same lease
    assert slot["vram_estimate"]["mb"] == COSTS.mb(2)


async def test_out_of_memory_after_lowering_fails_the_load_and_leaves_nothing(tmp_path):
    coord, log = layered(tmp_path, 1000, fail_starts=[RuntimeError(OOM), RuntimeError(OOM)])
    code, status, events = await served(coord)
    assert code >= 500
    assert log.count(("start", "voice")) == 2  # lowered once, never again, no claim-more
    assert [e["type"] for e in events if e["type"] in ("layers_lowered", "oom_retry")] == [
        "layers_lowered"]
    assert slot_of(status)["state"] == "idle" and status["gpus"][0]["leased_mb"] == 0


async def test_a_worker_holding_more_than_its_lease_is_started_again_with_fewer_layers(
        tmp_path):
    # its first report: 1100 MB held in a 921 MB lease; its second (the measured one): 650
    coord, log = layered(tmp_path, 1000, reports=[{"cuda_reserved_mb": 1100},
                                                  {"cuda_reserved_mb": 650}])
    code, status, events = await served(coord)
    assert code == 200
    assert [entry[1] for entry in log if entry[0] == "layers"] == [4, 2]
    assert ("stop", "voice") in log
    lowered = next(e for e in events if e["type"] == "layers_lowered")
    assert "holds 1100 MB of VRAM, its lease 921 MB" in lowered["reason"]
    assert slot_of(status)["placement"]["gpu_layers"] == 2
    assert coord.pool.learned.measured_vram("voice", 2) == 650  # kept at its count
    assert coord.pool.learned.measured_vram("voice") is None


async def test_a_parked_model_comes_back_with_its_plan(tmp_path):
    coord, log = layered(tmp_path, 1000)
    async with started_client(coord) as client:
        assert (await client.post("/v1/embeddings", json=embed())).status_code == 200
        parked = await client.post("/api/v1/models/voice/offload")
        assert parked.json()["offloaded"] is True
        assert (await client.post("/v1/embeddings", json=embed())).status_code == 200
        slot = slot_of((await client.get("/api/v1/status")).json())
        assert log.count(("start", "voice")) == 1  # onloaded, not started again
        assert slot["placement"]["gpu_layers"] == 4
        assert slot["placement"]["notes"] == ["4/8 layers on GPU 0: the plan it was parked with"]
        # parked again; meanwhile an outside lease takes 200 MB: 3 layers fit, not its 4
        await client.post("/api/v1/models/voice/offload")
        taken = await client.post("/api/v1/leases", json={
            "holder": "training", "kind": "training", "allocations": {"0": 200}})
        assert taken.status_code in (200, 201), taken.text
        assert (await client.post("/v1/embeddings", json=embed())).status_code == 200
        slot = slot_of((await client.get("/api/v1/status")).json())
        events = (await client.get("/api/v1/events?stream=false")).json()["events"]
    assert log.count(("start", "voice")) == 2 and ("layers", 3) in log
    assert slot["placement"]["gpu_layers"] == 3
    stopped = [e for e in events if e["type"] == "unloaded"]
    assert "parked with 4 of 8 layers on the GPU, which need 921 MB; leased 800 MB" in \
        stopped[-1]["reason"]


@pytest.mark.parametrize(("gpu_mb", "warm", "admitted"), [
    (1000, False, False),  # not loaded: the planner would place 4 of 8, learned at 5 s
    (1000, True, False),   # loaded with 4 of 8
    (4000, False, True),   # room for the whole model: its 0.1 s
    (4000, True, True),
])
async def test_a_budget_weighs_the_time_at_the_layers_placed(tmp_path, gpu_mb, warm, admitted):
    coord, _ = layered(tmp_path, gpu_mb)
    async with started_client(coord) as client:  # learned once started (it reads its file)
        if warm:
            assert (await client.post("/v1/embeddings", json=embed())).status_code == 200
        learned = coord.pool.learned
        learned.models.clear()
        learned.observe_inference("voice", 0.1)
        learned.observe_inference("voice", 5.0, layers=4)
        learned.observe_load("voice", 0.1)
        answer = await client.post("/v1/embeddings", json={**embed(), "x_budget_s": 2})
    assert (answer.status_code == 200) is admitted, answer.text
    if not admitted:
        assert answer.status_code == 503 and "inference 5.00s" in answer.text


async def test_the_time_a_request_took_is_learned_at_its_layers(tmp_path):
    coord, _ = layered(tmp_path, 1000)
    code, _, _ = await served(coord)
    assert code == 200
    stats = coord.pool.learned.get("voice")
    assert stats.layers[4].requests == 1 and stats.requests == 0


async def test_out_of_memory_at_a_fixed_count_claims_more_at_that_count(tmp_path):
    """Without allow_partial a manifest's count is kept as written: the load claims a quarter
    more, learned at that count (the figure its estimate reads), and goes again."""
    coord, log = layered(tmp_path, 4000, fail_starts=[RuntimeError(OOM)], gpu_layers=5,
                         allow_partial=False)
    code, status, events = await served(coord)
    assert code == 200 and log.count(("start", "voice")) == 2
    retry = next(e for e in events if e["type"] == "oom_retry")
    grown = -(-COSTS.mb(5) * 5 // 4)
    assert (retry["vram_mb"], retry["to_mb"]) == (COSTS.mb(5), grown)
    assert status["gpus"][0]["leased_mb"] == grown
    assert coord.pool.learned.measured_vram("voice", 5) == grown
    assert not [e for e in events if e["type"] == "layers_lowered"]


async def test_a_lease_taken_first_costs_layers_and_says_so(tmp_path):
    """Planned at 4 layers; an outside job takes 200 MB of the GPU just before the load's
    lease: the load goes on with the 3 layers that fit, and says so."""
    coord, log = layered(tmp_path, 1000)
    boss, raced = coord.pool.boss, []
    acquire = boss.acquire

    async def racing(**asked):
        if asked.get("note") == "voice" and not raced:
            raced.append(await acquire(kind="training", allocations={0: 200}, note="racer"))
        return await acquire(**asked)

    boss.acquire = racing
    code, status, events = await served(coord)
    assert code == 200 and raced and ("layers", 3) in log
    lowered = next(e for e in events if e["type"] == "layers_lowered")
    assert (lowered["from_layers"], lowered["to_layers"]) == (4, 3)
    assert "the lease planned for 4 layers was taken before it could be had" in \
        lowered["reason"]
    assert slot_of(status)["placement"]["gpu_layers"] == 3
