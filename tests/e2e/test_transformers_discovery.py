"""No YAML for transformers models either: folders as ``save_pretrained`` (or a hub download)
leaves them, put under ``models_dir``, are found, listed with their kinds and served by the
transformers worker through the official clients."""

from __future__ import annotations

import importlib.util

import httpx
import pytest

from tests.conftest import ServerProcess
from tests.lazy_modules import lazy
from tests.transformers_fixtures import (
    build_embedder,
    build_recogniser,
    build_reranker,
    build_voice,
    shared,
    speech_clip,
)

ollama = lazy("ollama")
openai = lazy("openai")

# looked for, not imported: both test processes collect every file, and importing
# sentence-transformers (torch, transformers, scikit-learn) costs each of them seconds
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None,
                                 reason="the 'transformers' extra")]


def test_model_folders_under_models_dir_are_served_without_a_manifest(tmp_path_factory):
    models_dir = tmp_path_factory.mktemp("discovered-models")
    (models_dir / "hub").mkdir()
    for name, built in (("MiniLM-embedder", ("embedder", build_embedder)),
                        ("tiny-reranker", ("reranker", build_reranker)),
                        ("tiny-wav2vec2", ("recogniser", build_recogniser)),
                        ("tiny-mms-tts", ("voice", build_voice))):  # the folders other tests use
        (models_dir / "hub" / name).symlink_to(shared(tmp_path_factory, *built))
    srv = ServerProcess(tmp_path_factory.mktemp("discovery"),
                        {"gpus": [{"index": 0, "name": "sim", "vram_mb": 4096}],
                         "models_dir": str(models_dir), "discover": True}, [])
    srv.start()
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        kinds = {m.id: m.model_extra["category"] for m in client.models.list().data}
        assert kinds == {"minilm-embedder": "embedding", "tiny-reranker": "rerank",
                         "tiny-wav2vec2": "stt", "tiny-mms-tts": "tts"}
        vectors = client.embeddings.create(model="minilm-embedder", input=["a cat", "a dog"])
        assert [len(d.embedding) for d in vectors.data] == [32, 32]
        ranked = httpx.post(srv.url + "/v1/rerank", timeout=120, json={
            "model": "tiny-reranker", "query": "cat", "documents": ["a cat", "a dog"]})
        assert ranked.status_code == 200, ranked.text
        assert sorted(r["index"] for r in ranked.json()["results"]) == [0, 1]
        heard = client.audio.transcriptions.create(
            model="tiny-wav2vec2", file=("clip.wav", speech_clip(1.0), "audio/wav"))
        assert isinstance(heard.text, str)
        spoken = client.audio.speech.create(model="tiny-mms-tts", input="Hello there.",
                                            voice="alloy", response_format="wav")
        assert spoken.content[:4] == b"RIFF"
        listed = {m.model: m.size for m in ollama.Client(host=srv.url).list().models}
        embedder = models_dir / "hub" / "MiniLM-embedder"
        assert listed["minilm-embedder"] == sum(
            f.stat().st_size for f in embedder.rglob("*") if f.is_file()) > 100_000
        assert srv.status()["slots"] and all(
            s["model"] in kinds for s in srv.status()["slots"])
    finally:
        srv.stop()
