"""Discovery and the catalog's reload diff, on files written here: real GGUF headers (the
``gguf`` package's writer), split parts, projectors, pipelines, manifests overlaying files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_boss.catalog import Catalog, build_catalog, diff_catalogs
from model_boss.catalog.discovery import PULLS_FILE, scan
from model_boss.catalog.gguf_header import read_metadata
from model_boss.settings import Settings
from tests.gguf_fixtures import write_gguf


def settings(tmp_path: Path, **extra) -> Settings:
    manifests = tmp_path / "manifests"
    manifests.mkdir(exist_ok=True)
    return Settings(manifests=[manifests], models_dir=tmp_path / "models", tasks_file=None,
                    state_dir=tmp_path / "state", **extra)


def models(tmp_path: Path, **extra) -> dict:
    return {e.manifest.id: e for e in build_catalog(settings(tmp_path, **extra))}


def test_the_header_reader_stops_before_the_vocabulary_and_reads_it_all_when_asked(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", vocab=20_000)
    quick = read_metadata(path)
    assert quick["llama.context_length"] == 8192
    assert "tokenizer.ggml.tokens" not in quick
    full = read_metadata(path, stop_at_vocabulary=False)
    assert full["tokenizer.ggml.tokens"] == 20_000  # arrays: their length
    assert full["tokenizer.chat_template"] == "{{ messages }}"


@pytest.mark.parametrize(("files", "expected"), [
    (["Qwen3-8B-Q4_K_M.gguf"], {"qwen3-8b-q4_k_m": "Qwen3-8B-Q4_K_M.gguf"}),
    (["big-00001-of-00003.gguf", "big-00002-of-00003.gguf", "big-00003-of-00003.gguf"],
     {"big": "big-00001-of-00003.gguf"}),
    (["a/m.gguf", "b/m.gguf"], {"m": "a/m.gguf", "b/m": "b/m.gguf"}),
    (["m.gguf", "mmproj-m-f16.gguf"], {"m": "m.gguf"}),
    (["m.gguf.partial", ".hidden.gguf", "notes.txt", "m2.GGUF"], {"m2": "m2.GGUF"}),
    (["1/2/3/4/deep.gguf", "1/2/3/4/5/too-deep.gguf"], {"deep": "1/2/3/4/deep.gguf"}),
])
def test_scan_names_files_as_models(tmp_path, files, expected):
    root = tmp_path / "models"
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"GGUF")
    found = {f.id: f.path.relative_to(root).as_posix() for f in scan(root)}
    assert found == expected


def test_a_projector_pairs_with_every_model_in_its_folder(tmp_path):
    root = tmp_path / "models"
    for name in ("vis/m-q4.gguf", "vis/m-q8.gguf", "vis/mmproj-f16.gguf", "other.gguf"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"GGUF")
    projectors = {f.id: f.mmproj.name if f.mmproj else None for f in scan(root)}
    assert projectors == {"m-q4": "mmproj-f16.gguf", "m-q8": "mmproj-f16.gguf",
                          "other": None}


def test_a_diffusers_folder_is_one_model_and_is_not_entered(tmp_path):
    root = tmp_path / "models"
    (root / "Tiny-SD" / "unet").mkdir(parents=True)
    (root / "Tiny-SD" / "model_index.json").write_text("{}")
    (root / "Tiny-SD" / "unet" / "stray.gguf").write_bytes(b"GGUF")
    found = scan(root)
    assert [(f.id, f.kind) for f in found] == [("tiny-sd", "diffusers")]


def _folder(root: Path, name: str, files: dict[str, object]) -> None:
    """A model folder as a hub download or ``save_pretrained`` leaves it (weights stand-in)."""
    (root / name).mkdir(parents=True)
    for file, content in files.items():
        (root / name / file).write_text(content if isinstance(content, str)
                                        else json.dumps(content))


ST_CONFIG = "config_sentence_transformers.json"
TRANSFORMERS_FOLDERS = {  # name: (files, the kind it serves or None)
    "bge-small-en": ({"config.json": {"architectures": ["BertModel"]}, "modules.json": [],
                      ST_CONFIG: {"model_type": "SentenceTransformer"},
                      "model.safetensors": ""}, "embedding"),
    "e5-older": ({"config.json": {"architectures": ["BertModel"]}, "modules.json": [],
                  "pytorch_model.bin": ""}, "embedding"),  # no model_type: older releases
    "ce-saved": ({"config.json": {"architectures": ["BertForSequenceClassification"]},
                  "modules.json": [], ST_CONFIG: {"model_type": "CrossEncoder"},
                  "model.safetensors": ""}, "rerank"),
    "bge-reranker": ({"config.json": {"architectures": ["XLMRobertaForSequenceClassification"],
                                      "id2label": {"0": "LABEL_0"}},
                      "model.safetensors": ""}, "rerank"),
    "sentiment": ({"config.json": {"architectures": ["BertForSequenceClassification"],
                                   "id2label": {"0": "NEG", "1": "POS"}},
                   "model.safetensors": ""}, None),  # a classifier, no reranker
    "whisper-tiny": ({"config.json": {"architectures": ["WhisperForConditionalGeneration"],
                                      "model_type": "whisper"},
                      "model.safetensors": ""}, "stt"),
    "wav2vec2": ({"config.json": {"architectures": ["Wav2Vec2ForCTC"]},
                  "pytorch_model.bin": ""}, "stt"),
    "mms-tts-eng": ({"config.json": {"architectures": ["VitsModel"], "model_type": "vits"},
                     "model.safetensors": ""}, "tts"),
    "vibevoice-7b-hf": ({"config.json": {"architectures": [
        "VibeVoiceForConditionalGeneration"], "model_type": "vibevoice"},
        "model-00001-of-00004.safetensors": ""}, "tts"),
    "sharded": ({"config.json": {"model_type": "whisper"},
                 "model-00001-of-00002.safetensors": "",
                 "model.safetensors.index.json": {}}, "stt"),
    "qwen-chat": ({"config.json": {"architectures": ["Qwen2ForCausalLM"]},
                   "model.safetensors": ""}, None),  # an LLM in transformers' form: no
    "no-weights": ({"config.json": {"model_type": "whisper"}}, None),  # a download cut short
    "sparse": ({"config.json": {}, "modules.json": [], ST_CONFIG: {"model_type": "SparseEncoder"},
                "model.safetensors": ""}, None),
}


def test_transformers_folders_are_models_of_the_kind_their_files_say(tmp_path):
    for name, (files, _kind) in TRANSFORMERS_FOLDERS.items():
        _folder(tmp_path / "models" / "hub", name, files)
    found = models(tmp_path)
    kinds = {name: (str(found[name].manifest.category) if name in found else None)
             for name in TRANSFORMERS_FOLDERS}
    assert kinds == {name: kind for name, (_files, kind) in TRANSFORMERS_FOLDERS.items()}
    embedder = found["bge-small-en"]
    assert (embedder.manifest.backend, embedder.manifest.source, embedder.path) == (
        "transformers", "discovered", tmp_path / "models" / "hub" / "bge-small-en")
    assert embedder.available


def test_a_transformers_folder_is_not_looked_into(tmp_path):
    files, _kind = TRANSFORMERS_FOLDERS["bge-small-en"]
    _folder(tmp_path / "models", "st", files)
    _folder(tmp_path / "models" / "st", "1_Pooling", {"config.json": {}})
    write_gguf(tmp_path / "models" / "st" / "onnx" / "stray.gguf")
    write_gguf(tmp_path / "models" / "beside.gguf")
    assert [(f.id, f.kind) for f in scan(tmp_path / "models")] == [
        ("beside", "gguf"), ("st", "transformers")]


@pytest.mark.parametrize(("arch", "pooling", "category", "embeddings", "reranking"), [
    ("llama", None, "llm", False, False),
    ("bert", 2, "embedding", True, False),      # cls
    ("bert", None, "embedding", True, False),   # an encoder without a declared pooling
    ("qwen3", 3, "embedding", True, False),     # last-token pooling: an embedder
    ("bert", 4, "embedding", False, True),      # rank: a reranker
    ("qwen3", 0, "llm", False, False),          # pooling none
])
def test_the_header_says_what_routes_a_file_answers(tmp_path, arch, pooling, category,
                                                    embeddings, reranking):
    write_gguf(tmp_path / "models" / "m.gguf", arch=arch, pooling=pooling)
    manifest = models(tmp_path)["m"].manifest
    assert (str(manifest.category), manifest.embeddings, manifest.reranking) == \
        (category, embeddings, reranking)


@pytest.mark.parametrize(("trained", "default", "served"),
                         [(8192, 4096, 8192), (2048, 4096, 2048), (0, 4096, 4096)])
def test_served_context_is_the_trained_one_else_the_default(tmp_path, trained, default,
                                                            served):
    write_gguf(tmp_path / "models" / "m.gguf", context=trained)
    assert models(tmp_path, default_ctx_size=default)["m"].manifest.ctx_size == served


@pytest.mark.parametrize("content", [
    b"GGUF\x03\x00\x00\x00\x01",  # cut short
    b"GGUF" + b"\1" * 200_000,  # lengths of petabytes: refused, never read into memory
    b"PK\x03\x04 a zip file",
])
def test_an_unreadable_file_is_listed_unavailable_saying_why(tmp_path, content):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "cut.gguf").write_bytes(content)
    (tmp_path / "models" / "fine.gguf").symlink_to(write_gguf(tmp_path / "fine.gguf"))
    found = models(tmp_path)
    assert not found["cut"].available
    assert "cannot read the GGUF header" in found["cut"].unavailable_reason
    assert found["fine"].available


def test_a_manifest_naming_a_file_overrides_it_field_by_field(tmp_path):
    write_gguf(tmp_path / "models" / "emb.gguf", arch="bert", pooling=1, context=512)
    write_gguf(tmp_path / "models" / "free.gguf")
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "e.yaml").write_text(
        "id: my-embedder\npath: emb.gguf\npriority: 9\naliases: [e]\n")
    found = models(tmp_path)
    assert sorted(found) == ["free", "my-embedder"]
    merged = found["my-embedder"].manifest
    assert (merged.source, merged.priority, merged.aliases) == ("manifest", 9, ["e"])
    # what the manifest does not say comes from the file
    assert (str(merged.category), merged.embeddings, merged.ctx_size) == ("embedding", True,
                                                                          512)
    assert found["free"].manifest.source == "discovered"


def test_a_discovered_name_a_manifest_uses_is_left_out(tmp_path):
    write_gguf(tmp_path / "models" / "chat.gguf")
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "c.yaml").write_text(
        "id: other\naliases: [chat]\nbackend: command\ncommand: [x]\n")
    assert sorted(models(tmp_path)) == ["other"]


def test_pulled_files_say_so(tmp_path):
    write_gguf(tmp_path / "models" / "hub" / "p.gguf")
    (tmp_path / "models" / PULLS_FILE).write_text(json.dumps(
        {"hub/p.gguf": {"source": "hf://org/repo/p.gguf"}}))
    assert models(tmp_path)["p"].manifest.source == "pulled"


def test_discovery_can_be_turned_off(tmp_path):
    write_gguf(tmp_path / "models" / "m.gguf")
    assert models(tmp_path, discover=False) == {}


def test_manifest_files_cannot_set_what_the_loader_fills_in(tmp_path):
    from model_boss.errors import ConfigError

    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "x.yaml").write_text("id: x\nsource: pulled\n")
    with pytest.raises(ConfigError, match=r"x\.yaml: source: set by model-boss"):
        models(tmp_path)


def catalog_of(tmp_path: Path) -> Catalog:
    return build_catalog(settings(tmp_path))


def test_the_diff_tells_added_changed_removed_and_which_changes_restart(tmp_path):
    (tmp_path / "manifests").mkdir()
    for name in ("keep", "soft", "hard", "gone"):
        (tmp_path / "manifests" / f"{name}.yaml").write_text(
            f"id: {name}\nbackend: command\ncommand: [run]\n")
    before = catalog_of(tmp_path)
    (tmp_path / "manifests" / "gone.yaml").unlink()
    (tmp_path / "manifests" / "soft.yaml").write_text(
        "id: soft\nbackend: command\ncommand: [run]\npriority: 7\naliases: [s]\n")
    (tmp_path / "manifests" / "hard.yaml").write_text(
        "id: hard\nbackend: command\ncommand: [run, --fast]\n")
    (tmp_path / "manifests" / "new.yaml").write_text("id: new\nbackend: command\ncommand: [r]\n")
    diff = diff_catalogs(before, catalog_of(tmp_path))
    assert diff.to_dict() == {"added": ["new"], "changed": ["hard", "soft"],
                              "removed": ["gone"]}
    assert diff.restart == ["hard"]
    assert not diff_catalogs(before, before)


def test_adopting_swaps_the_whole_catalog_for_every_holder(tmp_path):
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "a.yaml").write_text("id: a\nbackend: command\ncommand: [r]\n")
    held = catalog_of(tmp_path)
    listing = iter(held)
    (tmp_path / "manifests" / "a.yaml").unlink()
    (tmp_path / "manifests" / "b.yaml").write_text("id: b\nbackend: command\ncommand: [r]\n")
    held.adopt(catalog_of(tmp_path))
    assert [e.manifest.id for e in listing] == ["a"]  # an iteration begun before goes on
    assert [e.manifest.id for e in held] == ["b"] and "a" not in held


def test_two_hundred_files_are_two_hundred_models(tmp_path):
    source = write_gguf(tmp_path / "one.gguf", vocab=50_000)
    (tmp_path / "models").mkdir()
    for i in range(200):
        (tmp_path / "models" / f"m{i:03}.gguf").symlink_to(source)
    found = models(tmp_path)  # how long it takes: benchmarks/discovery_startup.py
    assert sorted(found) == [f"m{i:03}" for i in range(200)]
    assert all(e.available and e.manifest.ctx_size == 8192 for e in found.values())
