"""What this install can run (catalog/extras.py): the extra each kind needs (a table), the
reason a model whose extra is missing is listed unavailable, the hint a worker's own
``No module named`` line gets, and the catalog that lists such a model unavailable and refuses
it before any load. Modules are made missing by the injected ``importable``, never by
uninstalling anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_boss.catalog import Catalog
from model_boss.catalog.extras import (
    DIFFUSION,
    DIFFUSION_VIDEO,
    LLAMA_CPP_PYTHON,
    LLAMA_NATIVE,
    SENTENCE_TRANSFORMERS,
    SPEECH,
    VOICE_CLONING,
    default_llama_worker,
    install_hint,
    module_found,
    not_installed,
    requirement,
)
from model_boss.catalog.manifest import BackendKind, Category, LlamaWorker, ModelManifest
from model_boss.errors import ModelUnavailable
from model_boss.settings import Settings

B, C, W = BackendKind, Category, LlamaWorker


def manifest(backend: BackendKind, category: Category = C.LLM,
             worker: LlamaWorker | None = None, **extra) -> ModelManifest:
    fields = {"command": ["serve"]} if backend == B.COMMAND else \
        {"base_url": "http://remote/v1"} if backend == B.CLOUD else {}
    return ModelManifest(id="m", backend=backend, category=category, worker=worker, path="m",
                         **fields, **extra)


# (backend, category, the manifest's worker, the default llama worker) -> what it needs
NEEDS = [
    (B.DIFFUSERS, C.DIFFUSION, None, W.NATIVE, DIFFUSION),
    (B.DIFFUSERS, C.VIDEO, None, W.NATIVE, DIFFUSION_VIDEO),
    (B.TRANSFORMERS, C.EMBEDDING, None, W.NATIVE, SENTENCE_TRANSFORMERS),
    (B.TRANSFORMERS, C.RERANK, None, W.NATIVE, SENTENCE_TRANSFORMERS),
    (B.TRANSFORMERS, C.STT, None, W.NATIVE, SPEECH),
    (B.TRANSFORMERS, C.TTS, None, W.NATIVE, SPEECH),
    (B.LLAMA_SERVER, C.LLM, None, W.NATIVE, LLAMA_NATIVE),
    (B.LLAMA_SERVER, C.LLM, None, W.LLAMA_CPP_PYTHON, LLAMA_CPP_PYTHON),
    (B.LLAMA_SERVER, C.LLM, W.LLAMA_CPP_PYTHON, W.NATIVE, LLAMA_CPP_PYTHON),  # its own
    (B.LLAMA_SERVER, C.LLM, None, W.BINARY, None),  # an external llama-server: no module
    (B.LLAMA_SERVER, C.LLM, W.BINARY, W.NATIVE, None),
    (B.COMMAND, C.TTS, None, W.NATIVE, None),
    (B.CLOUD, C.LLM, None, W.NATIVE, None),
]


@pytest.mark.parametrize("backend, category, worker, default, expected", NEEDS)
def test_what_each_kind_needs(backend, category, worker, default, expected):
    assert requirement(manifest(backend, category, worker), default) == expected


@pytest.mark.parametrize("settings, expected", [
    ({}, W.NATIVE), ({"llama_server_binary": "/opt/llama-server"}, W.BINARY),
    ({"llama_worker": "llama-cpp-python"}, W.LLAMA_CPP_PYTHON),
    ({"llama_worker": "native", "llama_server_binary": "/opt/llama-server"}, W.NATIVE),
])
def test_the_default_llama_worker(settings, expected):
    assert default_llama_worker(Settings(**settings)) == expected


# (what it needs, the modules this install lacks) -> the reason's words, or None
REASONS = [
    (DIFFUSION, set(), None),
    (None, {"torch"}, None),  # needs nothing: nothing missing
    (DIFFUSION, {"torch"}, "this install lacks the 'diffusion' extra (no module named "
                           "'torch'): install it with `bash scripts/setup.sh llama,diffusion`, "
                           "then `model-boss reload`"),
    (DIFFUSION, {"torch", "diffusers", "transformers", "xllamacpp"},
     "(no module named 'torch', 'diffusers', 'transformers')"),
    (DIFFUSION_VIDEO, {"av"}, "'diffusion' extra (no module named 'av')"),
    (SENTENCE_TRANSFORMERS, {"sentence_transformers"},
     "`bash scripts/setup.sh llama,transformers`"),
    (SPEECH, {"sentence_transformers"}, None),  # speech does not use it
    (LLAMA_NATIVE, {"xllamacpp"}, "lacks the 'llama' extra (no module named 'xllamacpp'): "
                                  "install it with `bash scripts/setup.sh llama`,"),
    (LLAMA_CPP_PYTHON, {"llama_cpp"}, "`bash scripts/setup.sh llama,llama-cpp-python`"),
]


@pytest.mark.parametrize("needed, missing, words", REASONS)
def test_the_reason_names_the_extra_and_its_command(needed, missing, words):
    reason = not_installed(needed, lambda module: module not in missing)
    assert reason is None if words is None else words in reason


# (what the worker needs, its error line) -> the hint, or None
HINTS = [
    (DIFFUSION, "ModuleNotFoundError: No module named 'torch'",
     "the 'diffusion' extra is not installed: install it with "
     "`bash scripts/setup.sh llama,diffusion`"),
    (DIFFUSION, "ModuleNotFoundError: No module named 'diffusers.pipelines'",
     "the 'diffusion' extra"),  # a submodule: its package decides
    (SENTENCE_TRANSFORMERS, "No module named 'sentence_transformers'", "'transformers' extra"),
    (LLAMA_NATIVE, "ModuleNotFoundError: No module named 'xllamacpp'", "setup.sh llama`"),
    (DIFFUSION, "ModuleNotFoundError: No module named 'workers'", None),  # not the extra's
    (DIFFUSION, "OSError: no file named model_index.json", None),
    (None, "No module named 'torch'", None),
]


@pytest.mark.parametrize("needed, error, words", HINTS)
def test_a_workers_missing_module_names_the_extra(needed, error, words):
    hint = install_hint(needed, error)
    assert hint is None if words is None else words in hint


def test_module_found_asks_without_importing():
    assert module_found("json") and not module_found("no_such_module_here")
    assert not module_found("")  # find_spec's ValueError: found as missing, not raised


def _pipeline(folder: Path, class_name: str = "StableDiffusionPipeline") -> Path:
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps({"_class_name": class_name}))
    return folder


def test_the_catalog_lists_a_model_whose_extra_is_missing_unavailable(tmp_path):
    gguf = tmp_path / "smol.gguf"
    gguf.write_bytes(b"GGUF")
    asked: list[str] = []

    def importable(module: str) -> bool:  # the llama extra alone
        asked.append(module)
        return module == "xllamacpp"

    catalog = Catalog([
        ModelManifest(id="sd", backend=B.DIFFUSERS, category=C.DIFFUSION,
                      path=str(_pipeline(tmp_path / "sd"))),
        ModelManifest(id="clip", backend=B.DIFFUSERS, category=C.DIFFUSION,
                      path=str(_pipeline(tmp_path / "wan", "WanPipeline"))),
        ModelManifest(id="smol", path=str(gguf)),
        ModelManifest(id="cpp", path=str(gguf), worker=W.LLAMA_CPP_PYTHON),
        ModelManifest(id="gone", backend=B.DIFFUSERS, category=C.DIFFUSION,
                      path=str(tmp_path / "nowhere")),
    ], tmp_path, importable=importable)
    assert catalog.get("smol").available
    sd = catalog.get("sd")
    assert not sd.available and "'diffusion' extra" in sd.unavailable_reason
    assert "setup.sh llama,diffusion" in sd.unavailable_reason
    assert "'av'" in catalog.get("clip").unavailable_reason  # a video pipeline: PyAV too
    assert "'llama-cpp-python' extra" in catalog.get("cpp").unavailable_reason
    assert "not found" in catalog.get("gone").unavailable_reason  # the file comes first
    assert asked.count("torch") == 1  # asked once per catalog, whatever the models
    with pytest.raises(ModelUnavailable) as refused:  # refused, never loaded
        catalog.get_available("sd")
    assert "setup.sh llama,diffusion" in refused.value.message
    assert refused.value.status_code == 503 and refused.value.code == "model_unavailable"


def test_a_default_binary_llama_worker_needs_no_module(tmp_path):
    gguf = tmp_path / "smol.gguf"
    gguf.write_bytes(b"GGUF")
    catalog = Catalog([ModelManifest(id="smol", path=str(gguf))], tmp_path,
                      importable=lambda module: False, llama_default=W.BINARY)
    assert catalog.get_available("smol").available


def test_an_adapter_of_a_base_whose_extra_is_missing_says_so(tmp_path):
    lora = tmp_path / "style.safetensors"
    lora.write_bytes(b"x")
    base = ModelManifest(id="sd", backend=B.DIFFUSERS, category=C.DIFFUSION,
                         path=str(_pipeline(tmp_path / "sd")),
                         adapters=[{"id": "styled", "path": str(lora)}])
    catalog = Catalog([base], tmp_path, importable=lambda module: module != "torch")
    reason = catalog.get("styled").unavailable_reason
    assert "its base 'sd' is unavailable" in reason and "'diffusion' extra" in reason


def _vibevoice(folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "vibevoice"}))
    return folder


@pytest.mark.parametrize(("fields", "modules"), [
    ({"category": C.TTS}, SPEECH.modules),  # a VITS voice: transformers' pipeline alone
    ({"category": C.EMBEDDING}, SENTENCE_TRANSFORMERS.modules),
    # layers streamed from CPU RAM: diffusers' group offloading hooks
    ({"category": C.TTS, "allow_partial": True}, (*SPEECH.modules, "diffusers")),
    ({"category": C.EMBEDDING, "gpu_layers": 2},
     (*SENTENCE_TRANSFORMERS.modules, "diffusers")),
    ({"category": C.EMBEDDING, "gpu_layers": -1}, SENTENCE_TRANSFORMERS.modules),
])
def test_layers_streamed_need_diffusers(tmp_path, fields, modules):
    needed = requirement(ModelManifest(id="m", backend=B.TRANSFORMERS, path=str(tmp_path),
                                       **fields))
    assert needed.extra == "transformers" and needed.modules == modules


def test_a_vibevoice_without_diffusers_is_unavailable_naming_it(tmp_path):
    folder = _vibevoice(tmp_path / "vibevoice")
    voice = ModelManifest(id="vv", backend=B.TRANSFORMERS, category=C.TTS, path=str(folder))
    assert requirement(voice) == VOICE_CLONING and "diffusers" in VOICE_CLONING.modules
    catalog = Catalog([voice, ModelManifest(id="vits", backend=B.TRANSFORMERS,
                                            category=C.TTS, path=str(tmp_path))],
                      tmp_path, importable=lambda module: module != "diffusers")
    reason = catalog.get("vv").unavailable_reason
    assert "lacks the 'transformers' extra (no module named 'diffusers')" in reason
    assert "setup.sh llama,transformers" in reason
    assert catalog.get("vits").available  # a VITS voice samples with no scheduler
