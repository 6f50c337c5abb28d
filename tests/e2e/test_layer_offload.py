"""Layer offload on the transformers worker (workers/transformers/layers.py), with tiny
random-weight models on the CPU: ``gpu_layers`` N of M keeps N blocks with the model and puts
diffusers' group offloading hooks on the other M - N; the answers equal the whole model's (a
VibeVoice's audio under one seed, an embedder's vectors); the CPU-RAM tier keeps the plan; the
daemon passes the split to its worker (a number, or ``auto`` from the planner's VRAM) and shows
"N of M layers" in its status and ``ps``.

What the CPU cannot show: here the device is the CPU, so the hooks move blocks from CPU to
CPU; the side stream, pinned memory and the VRAM held are CUDA's (the ``gpu`` test below, and
benchmarks/layer_offload.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess, worker_health
from tests.lazy_modules import lazy
from tests.transformers_fixtures import (
    VIBEVOICE_VOICES,
    build_embedder,
    build_vibevoice,
    shared,
)

np = lazy("numpy")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None
                                 or importlib.util.find_spec("diffusers") is None,
                                 reason="the 'transformers' extra")]

LAYERS = 4


def build_deep_embedder(path: Path) -> Path:
    return build_embedder(path, layers=LAYERS)


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> Path:
    return shared(tmp_path_factory, "embedder-4-layers", build_deep_embedder)


@pytest.fixture(scope="module")
def vibevoice(tmp_path_factory) -> Path:
    return shared(tmp_path_factory, "vibevoice", build_vibevoice)


def engine(folder: Path, task: str, gpu_layers: int | None, device: str = "cpu"):
    from workers.transformers.engine import Engine
    from workers.transformers.options import WorkerOptions

    loaded = Engine(WorkerOptions(model=str(folder), task=task, port=0, device=device,
                                  gpu_layers=gpu_layers))
    loaded.load()
    assert loaded.state == "ready", loaded.error
    return loaded


def hooked(loaded) -> list[int]:
    from workers.transformers.layers import streamed_blocks

    return streamed_blocks(loaded.layers)


def test_an_embedder_split_embeds_as_the_whole_and_keeps_its_plan_parked(embedder):
    texts = ["the cat sat on the mat", "a dog", "model boss queue gpu"]
    whole, split = engine(embedder, "embedding", None), engine(embedder, "embedding", 1)
    assert whole.layers is None and whole.report()["gpu_layers"] is None
    assert split.layers.name.endswith("encoder.layer") and split.layers.total == LAYERS
    assert hooked(split) == [1, 2, 3]  # block 0 stays with the model, the rest stream
    report = split.report()
    assert (report["gpu_layers"], report["total_layers"]) == (1, LAYERS)
    expected = [vector for vector, _ in whole.embed(texts)]
    assert [v.tolist() for v, _ in split.embed(texts)] == [v.tolist() for v in expected]
    # the CPU-RAM tier: parked and brought back, the same blocks stream and the answer holds
    assert split.offload()["state"] == "offloaded" and split.onload()["state"] == "ready"
    assert hooked(split) == [1, 2, 3] and split.report()["gpu_layers"] == 1
    assert [v.tolist() for v, _ in split.embed(texts)] == [v.tolist() for v in expected]


def test_the_streamed_blocks_and_their_hooks_go_with_the_model(embedder):
    """Nothing outside the model holds a streamed block, its hook or its staged copies (no
    registry, no cache): once the worker lets its model go, they are collected. (On CUDA the
    pinned copies and the stream belong to the same hooks; the worker's process ends with its
    model, which the daemon test below sees.)"""
    import gc
    import weakref

    split = engine(embedder, "embedding", 1)
    blocks = split.layers.streamed
    hooks = [block._diffusers_hook for block in blocks]
    watched = [weakref.ref(x) for x in (*blocks, *hooks, split.model)]
    split.embed(["a forward through every hook"])
    del split, blocks, hooks
    gc.collect()
    assert [ref() for ref in watched] == [None] * len(watched)


def test_every_layer_wanted_is_no_split(embedder):
    for wanted in (-1, LAYERS, LAYERS + 3):
        assert engine(embedder, "embedding", wanted).layers is None


class Ticket:
    def check(self) -> None:
        pass


def speak(loaded, folder: Path, seed: int) -> np.ndarray:
    from workers.transformers.audio import decode
    from workers.transformers.script import parse_script

    voices = [decode((folder / "voices" / f"{name}.wav").read_bytes(), loaded.rate)
              for name in sorted(VIBEVOICE_VOICES)]
    heard: list[np.ndarray] = []
    loaded.speak_in_voices(parse_script("Speaker 1: Hello there.\nSpeaker 2: Hi."), voices,
                           seed, heard.append, Ticket())
    return np.concatenate(heard)


def test_a_vibevoice_split_speaks_the_same_samples_under_one_seed(vibevoice):
    whole, split = engine(vibevoice, "tts", None), engine(vibevoice, "tts", 1)
    assert split.layers.name.endswith("language_model.layers")
    assert (split.layers.resident, split.layers.total) == (1, 2) and hooked(split) == [1]
    expected = speak(whole, vibevoice, seed=7)
    assert expected.size > 0
    assert np.array_equal(speak(split, vibevoice, seed=7), expected)
    assert not np.array_equal(speak(split, vibevoice, seed=8), expected)


@pytest.mark.gpu
def test_on_a_gpu_streamed_blocks_wait_in_pinned_memory(embedder):
    """On CUDA: the resident part in VRAM, the streamed blocks in pinned CPU memory between
    forwards, prefetch through a side stream; the same vectors as the whole model."""
    import torch

    texts = ["the cat sat on the mat", "a dog"]
    whole, split = engine(embedder, "embedding", None, "cuda"), \
        engine(embedder, "embedding", 1, "cuda")
    assert split.layers.prefetch and hooked(split) == [1, 2, 3]
    blocks = list(split.layers.blocks)
    assert next(blocks[0].parameters()).device.type == "cuda"
    expected = [v for v, _ in whole.embed(texts)]
    got = [v for v, _ in split.embed(texts)]
    for a, b in zip(got, expected, strict=True):
        assert np.allclose(a, b, atol=1e-5)
    parked = next(blocks[-1].parameters())
    assert parked.device.type == "cpu" and parked.is_pinned()
    assert torch.cuda.memory_allocated() > 0


@pytest.fixture(scope="module")
def server(tmp_path_factory, embedder):
    manifests = [
        # a number: the manifest's count, whatever fits
        {"id": "split", "backend": "transformers", "category": "embedding",
         "path": str(embedder), "gpu_layers": 1, "allow_partial": True, "vram_mb": 400},
        # auto: the planner's VRAM (1500 MB free) cannot hold 5000 MB, so as many layers as
        # the headers' sizes say fit (all but one: a partial offload is never all)
        {"id": "auto", "backend": "transformers", "category": "embedding",
         "path": str(embedder), "allow_partial": True, "vram_mb": 5000},
    ]
    srv = ServerProcess(tmp_path_factory.mktemp("layer-offload"),
                        {"gpus": [{"index": 0, "name": "sim", "vram_mb": 1600}],
                         "vram_margin_mb": 100}, manifests)
    srv.start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("model, layers", [("split", 1), ("auto", LAYERS - 1)])
def test_the_daemon_splits_and_counts_the_layers(server, model, layers):
    httpx.post(server.url + "/v1/embeddings", json={"model": model, "input": "a cat"},
               timeout=120).raise_for_status()
    slot = next(s for s in server.status()["slots"] if s["model"] == model)
    processor = slot["processor"]
    assert (processor["gpu_layers"], processor["total_layers"]) == (layers, LAYERS)
    health = worker_health(slot)
    assert (health["gpu_layers"], health["total_layers"]) == (layers, LAYERS)
    percent = round(100 * layers / LAYERS)
    label = f"{100 - percent}%/{percent}% CPU/GPU (declared)"
    assert processor["label"] == label
    ps = subprocess.run([sys.executable, "-m", "model_boss", "--url", server.url, "ps"],
                        capture_output=True, text=True, timeout=30)
    assert ps.returncode == 0 and label[:26] in ps.stdout


def test_a_parked_model_comes_back_with_its_plan_and_goes_whole(server):
    """The CPU-RAM tier keeps the plan the planner gave: parked and asked for again, the same
    worker comes back with its layers as they were (the placement says so), and an unload
    ends the worker that held the streamed blocks."""
    def slot() -> dict:
        return next(s for s in server.status()["slots"] if s["model"] == "auto")

    httpx.post(server.url + "/v1/embeddings", json={"model": "auto", "input": "a cat"},
               timeout=120).raise_for_status()
    pid = slot()["pid"]
    parked = httpx.post(server.url + "/api/v1/models/auto/offload", timeout=60).json()
    assert parked["offloaded"] is True and slot()["state"] == "offloaded"
    httpx.post(server.url + "/v1/embeddings", json={"model": "auto", "input": "a dog"},
               timeout=120).raise_for_status()
    back = slot()
    assert back["pid"] == pid and back["placement"]["gpu_layers"] == LAYERS - 1
    assert back["placement"]["notes"] == [
        f"{LAYERS - 1}/{LAYERS} layers on GPU 0: the plan it was parked with"]
    assert worker_health(back)["gpu_layers"] == LAYERS - 1
    estimate = back["vram_estimate"]
    assert estimate["whole_mb"] == 5000 and estimate["mb"] < 5000
    assert estimate["detail"].startswith(f"{LAYERS - 1} of {LAYERS} layers on the GPU")
    httpx.post(server.url + "/api/v1/models/auto/unload", timeout=60).raise_for_status()
    import os
    import time
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"worker {pid} still running after the unload")
    assert slot()["state"] == "idle" and slot()["lease"] is None
