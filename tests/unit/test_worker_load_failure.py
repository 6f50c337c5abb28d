"""A worker that stays up but says its load failed (backends/base.py): the load fails at that
first health answer, in the worker's own words, with the extra to install when the words are a
missing module of its kind; a worker still loading is waited for as before."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from model_boss.backends.registry import DiffusersBackend, TransformersBackend
from model_boss.catalog import Catalog
from model_boss.catalog.manifest import BackendKind, Category, ModelManifest
from model_boss.errors import LoadFailed
from model_boss.settings import Settings


def backend(tmp_path: Path, kind: type = DiffusersBackend):
    folder = tmp_path / "m"
    folder.mkdir()
    if kind is DiffusersBackend:
        (folder / "model_index.json").write_text('{"_class_name": "StableDiffusionPipeline"}')
        manifest = ModelManifest(id="m", backend=BackendKind.DIFFUSERS,
                                 category=Category.DIFFUSION, path=str(folder))
    else:
        manifest = ModelManifest(id="m", backend=BackendKind.TRANSFORMERS,
                                 category=Category.EMBEDDING, path=str(folder))
    entry = Catalog([manifest], tmp_path, importable=lambda module: True).get("m")
    return kind(entry, Settings(state_dir=str(tmp_path / "state")))


def answering(worker, status: int, body: dict) -> None:
    """The worker's /health answers ``status`` with ``body``."""
    worker._client = httpx.AsyncClient(base_url="http://worker", transport=httpx.MockTransport(
        lambda request: httpx.Response(status, content=json.dumps(body).encode())))


# (the worker's /health, what the load error says) ; None: still loading, no error
ANSWERS = [
    ({"state": "failed", "error": "ModuleNotFoundError: No module named 'torch'"},
     "loading 'm' failed in its worker: ModuleNotFoundError: No module named 'torch'; the "
     "'diffusion' extra is not installed: install it with `bash scripts/setup.sh "
     "llama,diffusion`"),
    ({"state": "failed", "error": "OSError: unexpected end of file"},
     "loading 'm' failed in its worker: OSError: unexpected end of file"),
    ({"state": "failed"}, "loading 'm' failed in its worker: the worker gave no reason"),
    ({"state": "loading", "load": {"fraction": 0.5}}, None),
    ({"error": {"code": 503, "message": "Loading model"}}, None),  # llama.cpp's while loading
]


@pytest.mark.parametrize("health, words", ANSWERS)
async def test_a_failed_load_fails_at_the_first_answer_that_says_so(tmp_path, health, words):
    worker = backend(tmp_path)
    answering(worker, 503, health)
    try:
        if words is None:
            assert await worker._probe_starting() is False
        else:
            with pytest.raises(LoadFailed) as failed:
                await worker._probe_starting()
            assert failed.value.message == words
            assert failed.value.status_code == 503 and failed.value.code == "model_load_failed"
    finally:
        await worker._client.aclose()


async def test_a_transformers_worker_names_its_own_extra(tmp_path):
    worker = backend(tmp_path, TransformersBackend)
    answering(worker, 503, {"state": "failed", "error": "ModuleNotFoundError: No module named "
                                                        "'sentence_transformers'"})
    with pytest.raises(LoadFailed, match="'transformers' extra is not installed"):
        await worker._probe_starting()
    await worker._client.aclose()


async def test_a_healthy_worker_is_up(tmp_path):
    worker = backend(tmp_path)
    answering(worker, 200, {"state": "ready"})
    assert await worker._probe_starting() is True
    await worker._client.aclose()
