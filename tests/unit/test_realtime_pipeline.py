"""A realtime pipeline's manifest, and the catalog's word on whether it can serve."""

from __future__ import annotations

import pytest

from model_boss.catalog import Catalog, ModelManifest, parse_manifest_text
from model_boss.catalog.manifest import BackendKind, Category
from model_boss.errors import ConfigError

TALK = """
id: talk
category: realtime
pipeline: {transcriber: ears, llm: brain, voice: mouth}
"""


def _models(tmp_path, **overrides):
    for name in ("ears", "brain", "mouth"):
        (tmp_path / name).mkdir(exist_ok=True)
    kinds = {"ears": Category.STT, "brain": Category.LLM, "mouth": Category.TTS}
    kinds.update(overrides)
    llama = (Category.LLM, Category.VISION)
    return [ModelManifest(id=name, path=name, category=kind,
                          backend=BackendKind.LLAMA_SERVER if kind in llama
                          else BackendKind.TRANSFORMERS)
            for name, kind in kinds.items() if kind is not None]


@pytest.mark.parametrize(("text", "problem"), [
    ("id: talk\ncategory: realtime\n", "pipeline: a category: realtime manifest names one"),
    ("id: talk\npipeline: {transcriber: a, llm: b, voice: c}\n",
     "pipeline: a category: realtime manifest names one"),
    (TALK + "path: x.gguf\n", "no path or backend of its own"),
    (TALK + "backend: transformers\n", "no path or backend of its own"),
    ("id: talk\ncategory: realtime\npipeline: {transcriber: a, llm: b}\n", "voice"),
    ("id: talk\ncategory: realtime\npipeline: {transcriber: a, llm: b, voice: c, x: d}\n",
     "x"),
])
def test_a_malformed_pipeline_manifest_names_its_field(text, problem):
    with pytest.raises(ConfigError, match=problem):
        parse_manifest_text(text, "talk.yaml")


@pytest.mark.parametrize(("overrides", "reason"), [
    ({}, None),
    ({"ears": None}, "pipeline.transcriber: no model 'ears'"),
    ({"brain": Category.TTS}, "pipeline.llm: 'brain' is a tts model, not llm or vision"),
    ({"mouth": Category.STT}, "pipeline.voice: 'mouth' is a stt model, not tts"),
    ({"brain": Category.VISION}, None),
])
def test_a_pipeline_is_unavailable_with_the_reason_its_models_give(tmp_path, overrides,
                                                                  reason):
    catalog = Catalog([*_models(tmp_path, **overrides), *parse_manifest_text(TALK)], tmp_path,
                      importable=lambda module: True)
    assert catalog.get("talk").unavailable_reason == reason


def test_a_pipeline_whose_model_is_unavailable_says_which_and_why(tmp_path):
    models = _models(tmp_path)
    (tmp_path / "mouth").rmdir()
    catalog = Catalog([*models, *parse_manifest_text(TALK)], tmp_path,
                      importable=lambda module: True)
    assert catalog.get("talk").unavailable_reason.startswith(
        "pipeline.voice: 'mouth' is unavailable: model file not found")


def test_a_pipeline_without_silero_vad_names_the_realtime_extra(tmp_path):
    catalog = Catalog([*_models(tmp_path), *parse_manifest_text(TALK)], tmp_path,
                      importable=lambda module: module != "silero_vad")
    assert "lacks the 'realtime' extra (no module named 'silero_vad')" in \
        catalog.get("talk").unavailable_reason
