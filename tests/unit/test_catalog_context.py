"""The context a llama.cpp model is served with and where it is set (catalog/context.py):
read from the GGUF where no manifest sets it, fitted only then, and the 400 of a prompt too
long saying the context and the field that sets it."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from model_boss.backends.worker_errors import upstream_error
from model_boss.catalog import build_catalog
from model_boss.catalog.context import context_view, context_words, explain_overflow
from model_boss.catalog.manifest import ModelManifest
from model_boss.errors import ModelBossError
from model_boss.settings import Settings
from tests.gguf_fixtures import write_gguf


def catalog(tmp_path: Path, manifests: dict[str, str], fit=None, **extra) -> dict:
    folder = tmp_path / "manifests"
    folder.mkdir(exist_ok=True)
    for name, text in manifests.items():
        (folder / name).write_text(text)
    settings = Settings(manifests=[folder], models_dir=tmp_path / "models", tasks_file=None,
                        state_dir=tmp_path / "state", default_ctx_size=4096, **extra)
    return {e.manifest.id: e.manifest for e in build_catalog(settings, fit)}


@pytest.mark.parametrize(("manifest", "trained", "discover", "ctx", "source"), [
    ("id: m\npath: m.gguf\n", 8192, False, 8192, "trained"),           # none set: trained
    ("id: m\npath: m.gguf\nctx_size: 1024\n", 8192, False, 1024, "manifest"),  # set: wins
    ("id: m\npath: m.gguf\n", 0, False, 4096, "default"),              # header names none
    ("id: m\npath: gone.gguf\n", 8192, False, 4096, "default"),        # no file yet
    ("id: m\npath: m.gguf\n", 32768, True, 32768, "trained"),          # overlaying a find
    ("id: m\npath: m.gguf\nctx_size: 512\n", 32768, True, 512, "manifest"),
    ("id: m\nbackend: cloud\nbase_url: http://x\n", 8192, False, 2048, None),  # not llama
])
def test_the_served_context(tmp_path, manifest, trained, discover, ctx, source) -> None:
    write_gguf(tmp_path / "models" / "m.gguf", context=trained)
    served = catalog(tmp_path, {"m.yaml": manifest}, discover=discover)["m"]
    assert (served.ctx_size, served.ctx_from) == (ctx, source)


def test_a_discovered_file_is_served_its_trained_context(tmp_path) -> None:
    write_gguf(tmp_path / "models" / "big.gguf", context=131072)
    write_gguf(tmp_path / "models" / "old.gguf", context=0)
    found = catalog(tmp_path, {}, discover=True)
    assert (found["big"].ctx_size, found["big"].ctx_from) == (131072, "trained")
    assert (found["old"].ctx_size, found["old"].ctx_from) == (4096, "default")


def test_only_a_trained_context_is_fitted(tmp_path) -> None:
    write_gguf(tmp_path / "models" / "m.gguf", context=8192)
    asked = []

    def fit(manifest: ModelManifest, path: Path) -> ModelManifest:
        asked.append(manifest.id)
        lowered = manifest.model_copy(update={"ctx_size": 4096})
        lowered.ctx_note = "lowered from 8192 to 4096: because"
        return lowered

    served = catalog(tmp_path, {"a.yaml": "id: a\npath: m.gguf\n",
                                "b.yaml": "id: b\npath: m.gguf\nctx_size: 8192\n"}, fit)
    assert asked == ["a"]
    assert context_view(served["a"]) == {"ctx_size": 4096, "ctx_per_request": 4096,
                                         "ctx_from": "trained",
                                         "ctx_note": "lowered from 8192 to 4096: because"}
    assert served["b"].ctx_size == 8192 and served["b"].ctx_note is None


def manifest(ctx_from: str | None, note: str | None = None, source: str | None = "m.yaml",
             parallel: int | None = None) -> ModelManifest:
    found = ModelManifest(id="smol", path="/models/Smol.gguf", ctx_size=8192,
                          parallel=parallel)
    found.ctx_from, found.ctx_note = ctx_from, note
    found.source_file = f"/etc/model-boss/manifests/{source}" if source else None
    return found


@pytest.mark.parametrize(("model", "words"), [
    (manifest("manifest"), "'smol' runs with a context of 8192 tokens, set by `ctx_size` in "
                           "its manifest (m.yaml)"),
    (manifest("manifest", parallel=4),
     "'smol' runs with a context of 8192 tokens shared by its 4 parallel slots: 2048 per "
     "request, set by `ctx_size` in its manifest (m.yaml)"),
    (manifest("trained"), "'smol' runs with a context of 8192 tokens, the context it was "
                          "trained with (its GGUF header); `ctx_size` in its manifest "
                          "(m.yaml) sets another"),
    (manifest("trained", source=None),
     "'smol' runs with a context of 8192 tokens, the context it was trained with (its GGUF "
     "header); `ctx_size` in a manifest naming its file (a YAML file in the manifests folder "
     "with `path: Smol.gguf`) sets another"),
    (manifest("trained", "lowered from 32768 to 8192: the KV cache for 32768 tokens needs "
                         "4096 MB, the GPUs have 1200 MB free"),
     "'smol' runs with a context of 8192 tokens, lowered from 32768 to 8192: the KV cache for "
     "32768 tokens needs 4096 MB, the GPUs have 1200 MB free; `ctx_size` in its manifest "
     "(m.yaml) sets another"),
    (manifest("default", source=None),
     "'smol' runs with a context of 8192 tokens, the settings' `default_ctx_size` (its GGUF "
     "header names no trained context); `ctx_size` in a manifest naming its file (a YAML "
     "file in the manifests folder with `path: Smol.gguf`) sets another"),
])
def test_context_words(model, words) -> None:
    assert context_words(model) == words


LLAMA_REFUSAL = orjson.dumps({"error": {
    "code": 400, "message": "request (3031 tokens) exceeds the available context size "
                            "(1024 tokens), try increasing it",
    "type": "exceed_context_size_error", "n_prompt_tokens": 3031, "n_ctx": 1024}})


def test_a_prompt_over_the_context_is_a_400_naming_the_field() -> None:
    error = explain_overflow(upstream_error("smol", 400, LLAMA_REFUSAL),
                             manifest("manifest", parallel=8))
    assert error.status_code == 400 and error.code == "context_length_exceeded"
    assert error.message == (
        "smol: request (3031 tokens) exceeds the available context size (1024 tokens): "
        "'smol' runs with a context of 8192 tokens shared by its 8 parallel slots: 1024 per "
        "request, set by `ctx_size` in its manifest (m.yaml)")
    assert error.envelope()["error"]["n_ctx"] == 1024
    assert explain_overflow(error, manifest("manifest")).message == error.message  # once


@pytest.mark.parametrize("error", [
    ModelBossError("smol: something else", code="invalid_request", status_code=400),
    upstream_error("smol", 500, b'{"error": {"message": "boom"}}'),
])
def test_other_errors_are_left_as_they_are(error) -> None:
    before = error.message
    assert explain_overflow(error, manifest("manifest")).message == before


def test_a_model_not_served_by_llama_is_left_as_it_is() -> None:
    cloud = ModelManifest(id="c", backend="cloud", base_url="http://x")
    error = upstream_error("c", 400, LLAMA_REFUSAL)
    assert "runs with a context" not in explain_overflow(error, cloud).message
