"""Adapters in the catalog: each under its own id on its base's slot, the body its base's
worker gets (a table), what makes one unavailable, and discovery's pairing."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_boss.catalog import Catalog
from model_boss.catalog.adapters import Adapter, attach, on_base
from model_boss.catalog.manifest import BackendKind, ModelManifest, parse_manifest_text
from model_boss.errors import ConfigError, ModelUnavailable

A = Adapter("sql", "smol", 0, Path("a.gguf"), 1.0)
B = Adapter("poet", "smol", 1, Path("b.gguf"), 0.5)
LLAMA, DIFFUSERS = BackendKind.LLAMA_SERVER, BackendKind.DIFFUSERS

# (the adapter asked, the worker's adapters, backend, body) -> what the worker gets
TABLE = [
    (None, (), LLAMA, {"x": 1}, {"x": 1}),  # a base with no adapters: as it came
    (A, (A, B), LLAMA, {}, {"lora": [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.0}]}),
    (B, (A, B), LLAMA, {}, {"lora": [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.5}]}),
    # the base itself names every adapter at 0 (llama.cpp's caches know tokens, not loras)
    (None, (A, B), LLAMA, {}, {"lora": [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]}),
    (None, (A, B), LLAMA, {"lora": [{"id": 1, "scale": 2}]}, {"lora": [{"id": 1, "scale": 2}]}),
    (B, (A, B), DIFFUSERS, {}, {"adapter": "lora1", "adapter_scale": 0.5}),
    (None, (A, B), DIFFUSERS, {"p": 1}, {"p": 1}),
]


@pytest.mark.parametrize("adapter, loaded, backend, body, expected", TABLE)
def test_the_body_on_the_base(adapter, loaded, backend, body, expected):
    assert on_base(adapter, loaded, backend, body) == expected


def test_an_adapter_is_a_model_of_its_own_on_its_bases_slot(tmp_path, demo_gguf):
    from tests.lora_fixtures import write_broken_lora_gguf, write_lora_gguf

    good = write_lora_gguf(tmp_path / "good.gguf", demo_gguf)
    broken = write_broken_lora_gguf(tmp_path / "broken.gguf", demo_gguf, flaw="architecture")
    base = ModelManifest(id="smol", path=str(demo_gguf), adapters=[
        {"id": "sql", "path": str(good), "aliases": ["s"]},
        {"id": "bad", "path": str(broken)}, {"id": "gone", "path": "nowhere.gguf"},
        {"id": "poet", "path": str(good), "scale": 0.5}])
    catalog = Catalog([base], tmp_path)
    assert catalog.base_of("s") == catalog.base_of("poet") == "smol"
    assert catalog.get("sql").manifest.base == "smol"
    assert [a.id for a in catalog.get("smol").adapters] == ["sql", "poet"]  # servable, in order
    assert [a.index for a in catalog.get("smol").adapters] == [0, 1]  # the worker's numbers
    assert "qwen2" in catalog.get("bad").unavailable_reason
    assert "not found" in catalog.get("gone").unavailable_reason
    served, body = catalog.served_on("poet", {})
    assert served == "smol" and body["lora"] == [{"id": 0, "scale": 0.0},
                                                  {"id": 1, "scale": 0.5}]
    with pytest.raises(ModelUnavailable):
        catalog.served_on("bad", {})


def test_bad_adapter_lists_are_config_errors():
    with pytest.raises(ConfigError, match="scale"):
        parse_manifest_text("id: m\npath: m.gguf\nadapters: [{id: a, path: a.gguf, "
                            "scale: 9}]\n", "m.yaml")
    with pytest.raises(ConfigError, match="given twice"):
        parse_manifest_text("id: m\npath: m.gguf\nadapters: [{id: m, path: a.gguf}]\n",
                            "m.yaml")
    with pytest.raises(ConfigError, match="draft"):
        parse_manifest_text("id: m\nbackend: diffusers\npath: x\ndraft: d.gguf\n", "m.yaml")


def test_an_adapter_with_no_base_here_is_listed_saying_so(tmp_path):
    base = ModelManifest(id="smol", path=str(tmp_path / "smol.gguf"))
    unpaired = attach([base], [("stray", tmp_path / "stray.gguf",
                                {"general.base_model.0.name": "Llama 3"})])
    assert base.adapters == []
    assert unpaired[0].id == "stray" and "base is not here" in unpaired[0].problem
    assert "Llama 3" in unpaired[0].problem
    named = attach([base], [("smol.sql", tmp_path / "smol.sql.gguf", {})])
    assert named == [] and base.adapters[0].id == "smol.sql"


def _vocab_gguf(path: Path, tokens: list[str], model: str = "gpt2") -> Path:
    """A header-only GGUF with a tokenizer: what a draft's vocabulary check reads."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model(model)
    writer.add_token_list(tokens)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def test_a_draft_of_another_vocabulary_makes_its_model_unavailable(tmp_path, demo_gguf):
    other = _vocab_gguf(tmp_path / "other.gguf", [f"t{i}" for i in range(300)])
    ok = ModelManifest(id="fast", path=str(demo_gguf), draft=str(demo_gguf))
    bad = ModelManifest(id="odd", path=str(demo_gguf), draft=str(other))
    gone = ModelManifest(id="gone", path=str(demo_gguf), draft="nowhere.gguf")
    catalog = Catalog([ok, bad, gone], tmp_path)
    assert catalog.get("fast").available
    reason = catalog.get("odd").unavailable_reason
    assert "other.gguf" in reason and demo_gguf.name in reason and "vocabulary" in reason
    with pytest.raises(ModelUnavailable, match="vocabulary"):
        catalog.get_available("odd")  # a re-check keeps what the files said
    assert "draft model not found" in catalog.get("gone").unavailable_reason


def test_what_rides_in_a_worker_counts_in_its_estimate(tmp_path):
    from model_boss.gpu.estimate import VramEstimate, with_companions

    lora = tmp_path / "a.gguf"
    lora.write_bytes(b"\0" * (3 * 1024 * 1024))
    encoder = tmp_path / "ip_adapter" / "image_encoder"
    encoder.mkdir(parents=True)
    (encoder / "model.safetensors").write_bytes(b"\0" * (2 * 1024 * 1024))
    (tmp_path / "ip_adapter" / "ip-adapter.safetensors").write_bytes(b"\0" * (1024 * 1024))
    grown = with_companions(VramEstimate(100, "file"), [lora, tmp_path / "ip_adapter"])
    assert grown.mb == 106 and "2 adapter, draft or encoder files" in grown.detail
    kept = VramEstimate(100, "measured")  # measured with them loaded: as it is
    assert with_companions(kept, [lora]) is kept
