"""Settings and manifests: defaults, env over file, errors that name the file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_boss.catalog import Catalog, load_manifests, parse_manifest_text
from model_boss.errors import ConfigError, ModelNotFound, ModelUnavailable
from model_boss.settings import load_settings


def test_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv("MODEL_BOSS_CONFIG", raising=False)
    settings = load_settings()
    assert (settings.host, settings.port) == ("127.0.0.1", 8210)
    assert settings.redis_url == "" and settings.vram_margin_mb == 512
    assert settings.stay_warm_for("llm") == 300 and settings.stay_warm_for("diffusion") == 900


def test_yaml_file_with_env_override(monkeypatch, tmp_path):
    config = tmp_path / "mb.yaml"
    config.write_text("port: 9000\nmanifests: models\ngpus:\n  - {index: 0, vram_mb: 24576}\n")
    monkeypatch.setenv("MODEL_BOSS_PORT", "9100")
    settings = load_settings(config)
    assert settings.port == 9100
    assert settings.manifests == [tmp_path / "models"]
    assert settings.gpus[0].vram_mb == 24576 and settings.gpus[0].name == "declared"


def test_config_file_from_env(monkeypatch, tmp_path):
    config = tmp_path / "mb.yaml"
    config.write_text("reclaim_sleep_s: 0\n")
    monkeypatch.setenv("MODEL_BOSS_CONFIG", str(config))
    assert load_settings().reclaim_sleep_s == 0


@pytest.mark.parametrize("text, field", [
    ("port: eighty\n", "port"),
    ("gpus:\n  - {index: 0}\n", "gpus.0.vram_mb"),
    ("vram_margin_mb: -5\n", "vram_margin_mb"),
    ("no_such_key: 1\n", "no_such_key"),
    ("api_keys:\n  alice: k1\n  bob: k1\n", "api_keys.bob: the same key as api_keys.alice"),
    ("api_key: k1\napi_keys:\n  alice: k1\n", "api_keys.alice: the same key as api_key"),
    ("admin_api_key: k1\napi_keys:\n  alice: k1\n", "the same key as admin_api_key"),
    ("api_keys:\n  alice: ''\n", "api_keys.alice"),
    ("api_keys:\n  'has space': k1\n", "api_keys: Value error, client name 'has space'"),
    ("api_keys: [k1, k2]\n", "api_keys"),
])
def test_bad_settings_name_file_and_field(tmp_path, text, field):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    assert str(config) in caught.value.message
    assert field in caught.value.message


def test_settings_file_must_exist_and_be_a_mapping(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "missing.yaml")
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_settings(listy)


def test_manifest_file_forms(tmp_path):
    one = parse_manifest_text("id: a\npath: a.gguf\n", "one.yaml")
    many = parse_manifest_text("- {id: b, path: b.gguf}\n- {id: c, path: c.gguf}\n")
    wrapped = parse_manifest_text("models:\n  - {id: d, path: d.gguf}\n")
    assert [m.id for m in one + many + wrapped] == ["a", "b", "c", "d"]
    assert one[0].category == "llm" and one[0].backend == "llama-server"
    assert one[0].gpu_layers == "auto" and one[0].concurrency == 1


@pytest.mark.parametrize("text, field", [
    ("id: a\ncategory: painting\n", "category"),
    ("id: a\nbackend: magic\n", "backend"),
    ("id: a\nctx_size: ten\n", "ctx_size"),
    ("id: a\ngpu_layers: many\n", "gpu_layers"),
    ("path: x.gguf\n", "id"),
    ("id: a\nbogus: 1\n", "bogus"),
])
def test_bad_manifest_names_file_and_field(tmp_path, text, field):
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_manifests([tmp_path])
    assert str(path) in caught.value.message and field in caught.value.message


def test_duplicate_names_across_files(tmp_path):
    (tmp_path / "a.yaml").write_text("id: a\naliases: [shared]\npath: a.gguf\n")
    (tmp_path / "b.yaml").write_text("id: b\naliases: [shared]\npath: b.gguf\n")
    with pytest.raises(ConfigError, match="shared.*already defined"):
        load_manifests([tmp_path])


def test_missing_model_file_is_unavailable_not_fatal(tmp_path):
    real = tmp_path / "real.gguf"
    real.write_bytes(b"GGUF")
    (tmp_path / "m.yaml").write_text(
        f"- {{id: real, path: {real}}}\n- {{id: gone, path: gone.gguf}}\n")
    catalog = Catalog(load_manifests([tmp_path / "m.yaml"]), models_dir=tmp_path / "models")
    assert catalog.get_available("real").path == real
    gone = catalog.get("gone")
    assert not gone.available and str(tmp_path / "models" / "gone.gguf") in \
        gone.unavailable_reason
    with pytest.raises(ModelUnavailable) as caught:
        catalog.get_available("gone")
    assert caught.value.status_code == 503
    with pytest.raises(ModelNotFound):
        catalog.get("nobody")


def test_manifest_sources_must_exist(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_manifests([Path(tmp_path / "nowhere")])


def test_env_values(monkeypatch, tmp_path):
    monkeypatch.setenv("MODEL_BOSS_MANIFESTS", f"{tmp_path}/a:{tmp_path}/b")
    monkeypatch.setenv("MODEL_BOSS_GPUS", '[{"index": 0, "name": "sim", "vram_mb": 24576}]')
    settings = load_settings()
    assert settings.manifests == [tmp_path / "a", tmp_path / "b"]
    assert settings.gpus[0].vram_mb == 24576
    monkeypatch.setenv("MODEL_BOSS_GPUS", "not json")
    with pytest.raises(ConfigError, match="gpus"):
        load_settings()
