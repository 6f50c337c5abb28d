"""Manifest fields of llama models → the worker kind and ``llama-server``'s flags, one to one;
the native worker's flags → ``xllamacpp.CommonParams``."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_boss.backends.registry import (
    BACKENDS,
    BinaryLlamaBackend,
    LlamaCppPythonBackend,
    NativeLlamaBackend,
    worker_kind,
)
from model_boss.catalog import CatalogEntry, ModelManifest
from model_boss.catalog.manifest import LlamaWorker
from model_boss.errors import ConfigError
from model_boss.gpu.placement import Placement
from model_boss.settings import Settings, load_settings

MODEL = Path("/models/m.gguf")


def backend(cls=NativeLlamaBackend, settings: Settings | None = None, **fields):
    manifest = ModelManifest(id="m", path=str(MODEL), **fields)
    return cls(CatalogEntry(manifest, MODEL), settings or Settings())


def flags_of(argv: list[str]) -> dict[str, str | bool]:
    """``--name value`` pairs and bare ``--switch``es of a command line."""
    found: dict[str, str | bool] = {}
    for i, part in enumerate(argv):
        if part.startswith("--"):
            following = argv[i + 1] if i + 1 < len(argv) else "--"
            found[part] = True if following.startswith("--") else following
    return found


def single(gpu: int = 0) -> Placement:
    return Placement({gpu: 1000}, "single")


@pytest.mark.parametrize("manifest_worker, settings, expected", [
    (None, {}, LlamaWorker.NATIVE),
    (None, {"llama_server_binary": "/opt/llama-server"}, LlamaWorker.BINARY),
    (None, {"llama_worker": "llama-cpp-python"}, LlamaWorker.LLAMA_CPP_PYTHON),
    (None, {"llama_worker": "native", "llama_server_binary": "/x"}, LlamaWorker.NATIVE),
    ("binary", {}, LlamaWorker.BINARY),
    ("native", {"llama_worker": "binary"}, LlamaWorker.NATIVE),
])
def test_worker_kind_manifest_then_settings_then_binary_if_configured(manifest_worker, settings,
                                                                      expected):
    manifest = ModelManifest(id="m", worker=manifest_worker)
    assert worker_kind(manifest, Settings(**settings)) == expected


def test_the_pool_factory_builds_the_kind_and_keeps_one_choice_per_request():
    factory = BACKENDS[ModelManifest(id="m").backend]
    assert factory.choices_per_request == 1
    for kind, cls in (("native", NativeLlamaBackend), ("binary", BinaryLlamaBackend),
                      ("llama-cpp-python", LlamaCppPythonBackend)):
        entry = CatalogEntry(ModelManifest(id="m", worker=kind), MODEL)
        assert type(factory(entry, Settings())) is cls


@pytest.mark.parametrize("fields, placement, expected", [
    ({}, None, {"--ctx-size": "2048", "--n-gpu-layers": "0", "--parallel": "1",
                "--alias": "m", "--metrics": True}),
    ({"ctx_size": 8192, "parallel": 4}, single(), {"--ctx-size": "8192", "--parallel": "4",
                                                   "--n-gpu-layers": "999"}),
    ({"gpu_layers": 12}, single(), {"--n-gpu-layers": "12"}),
    ({}, Placement({0: 500}, "partial", gpu_layers=7, total_layers=30),
     {"--n-gpu-layers": "7"}),
    ({}, Placement({0: 400, 1: 600}, "split", tensor_split=(0.4, 0.6)),
     {"--tensor-split": "0.4,0.6", "--n-gpu-layers": "999"}),
    ({"main_gpu": 1, "threads": 6}, single(), {"--main-gpu": "1", "--threads": "6"}),
    ({"flash_attn": True}, None, {"--flash-attn": "on"}),
    ({"flash_attn": False}, None, {"--flash-attn": "off"}),
    ({"flash_attn": "on"}, None, {"--flash-attn": "on"}),
    ({"cache_type_k": "q8_0", "cache_type_v": "q4_0"}, None,
     {"--cache-type-k": "q8_0", "--cache-type-v": "q4_0"}),
    ({"embeddings": True}, None, {"--embeddings": True}),
    ({"embeddings": True, "pooling": "mean"}, None, {"--embeddings": True, "--pooling": "mean"}),
    ({"reranking": True}, None, {"--reranking": True}),
    ({"cache_ram_mb": 2048}, None, {"--cache-ram": "2048"}),
    ({"cache_ram_mb": 0}, None, {"--cache-ram": "0"}),
    ({"chat_template": "llama3"}, None, {"--chat-template": "llama3"}),
    ({"chat_template": "/templates/mine.jinja"}, None,
     {"--chat-template-file": "/templates/mine.jinja"}),
])
def test_manifest_fields_map_to_llama_server_flags(fields, placement, expected):
    flags = flags_of(backend(**fields).server_flags(8080, placement))
    assert flags["--model"] == str(MODEL) and flags["--port"] == "8080"
    assert flags["--host"] == "127.0.0.1"
    for name, value in expected.items():
        assert flags[name] == value, name


@pytest.mark.parametrize("fields, absent", [
    ({}, ["--tensor-split", "--main-gpu", "--threads", "--flash-attn", "--cache-type-k",
          "--cache-type-v", "--chat-template", "--chat-template-file", "--embeddings",
          "--pooling", "--reranking", "--api-key", "--cache-ram", "--slot-save-path"]),
    ({"chat_template": "native"}, ["--chat-template", "--chat-template-file"]),
    ({"chat_template": "alpaca"}, ["--chat-template", "--chat-template-file"]),
])
def test_defaults_leave_the_server_its_own(fields, absent):
    flags = flags_of(backend(**fields).server_flags(8080, None))
    assert not set(absent) & set(flags)


def test_a_jinja_template_resolves_against_the_manifest_directory(tmp_path):
    (tmp_path / "chat.jinja").write_text("{{ messages }}")
    native = backend(chat_template="chat.jinja")
    native.manifest.source_file = str(tmp_path / "m.yaml")
    assert flags_of(native.server_flags(1, None))["--chat-template-file"] == \
        str(tmp_path / "chat.jinja")


def test_native_and_binary_share_the_flags(tmp_path):
    binary_file = tmp_path / "llama-server"
    binary_file.write_text("#!/bin/sh\n")
    binary_file.chmod(0o755)
    settings = Settings(llama_server_binary=str(binary_file))
    native = backend(parallel=2, args=["--extra"]).argv(9000, None)
    binary = backend(BinaryLlamaBackend, settings, parallel=2, args=["--extra"]).argv(9000,
                                                                                      None)
    assert native[1:3] == ["-m", "workers.llama"] and binary[0] == str(binary_file)
    parent = native.index("--parent-pid")
    assert native[3:parent] == binary[1:-1] and native[-1] == binary[-1] == "--extra"


def test_manifest_validates_the_new_fields():
    with pytest.raises(ValueError):
        ModelManifest(id="m", cache_type_k="q3_x")
    with pytest.raises(ValueError):
        ModelManifest(id="m", worker="vllm")
    with pytest.raises(ValueError):
        ModelManifest(id="m", flash_attn="sometimes")
    with pytest.raises(ValueError):
        ModelManifest(id="m", pooling="max")
    with pytest.raises(ConfigError, match="llama_worker"):
        load_settings(llama_worker="python")


def test_a_projector_is_passed_beside_the_model():
    assert flags_of(backend(mmproj="mmproj-f16.gguf").server_flags(1, None))["--mmproj"] == \
        "/models/mmproj-f16.gguf"  # relative: beside the model file
    assert flags_of(backend(mmproj="/p/x.gguf").server_flags(1, None))["--mmproj"] == \
        "/p/x.gguf"
    assert "--mmproj" not in flags_of(backend().server_flags(1, None))


def test_native_worker_options_become_common_params():
    import xllamacpp  # the llama extra, which the test command installs: absent is broken

    from workers.llama import parse_args, to_params

    options = parse_args(["--model", "m.gguf", "--port", "9", "--ctx-size", "4096",
                          "--n-gpu-layers", "12", "--tensor-split", "0.25,0.75",
                          "--main-gpu", "1", "--threads", "3", "--parallel", "4",
                          "--chat-template", "chatml", "--flash-attn", "on",
                          "--cache-type-k", "q8_0", "--cache-type-v", "q4_0", "--reranking",
                          "--alias", "m", "--metrics", "--api-key", "k",
                          "--mmproj", "/models/mmproj-f16.gguf"])
    p = to_params(options)
    assert p.mmproj.path == "/models/mmproj-f16.gguf"
    assert (p.model.path, p.port, p.hostnames) == ("m.gguf", 9, ["127.0.0.1"])
    assert (p.n_ctx, p.n_gpu_layers, p.main_gpu, p.n_parallel) == (4096, 12, 1, 4)
    assert p.tensor_split[:3] == [0.25, 0.75, 0.0]
    assert p.cpuparams.n_threads == p.cpuparams_batch.n_threads == 3
    assert p.chat_template == "chatml"
    assert p.flash_attn_type == xllamacpp.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_ENABLED
    assert p.cache_type_k == xllamacpp.ggml_type.GGML_TYPE_Q8_0
    assert p.cache_type_v == xllamacpp.ggml_type.GGML_TYPE_Q4_0
    assert p.embedding and p.pooling_type == xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_RANK
    assert p.model_alias == {"m"} and p.api_keys == ["k"] and p.endpoint_metrics
    assert not p.fit_params  # the coordinator placed it; llama.cpp must not re-fit
    mean = to_params(parse_args(["--model", "m", "--port", "1", "--embeddings",
                                 "--pooling", "mean"]))
    assert mean.embedding
    assert mean.pooling_type == xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN


def test_native_worker_takes_llama_servers_sampling_flags_as_its_defaults():
    """A manifest's ``args: ["--temp", "0", ...]`` reach llama.cpp's sampling defaults (what a
    request that sets none of its own samples with), under llama-server's flag names."""
    import xllamacpp  # noqa: F401  (the llama extra: absent is a broken install)

    from workers.llama import parse_args, to_params

    p = to_params(parse_args(["--model", "m", "--port", "1", "--temp", "0", "-s", "7",
                              "--top-k", "5", "--top-p", "0.5", "--min-p", "0.25",
                              "--repeat-penalty", "1.5"]))
    assert (p.sampling.temp, p.sampling.seed, p.sampling.top_k) == (0.0, 7, 5)
    assert (p.sampling.top_p, p.sampling.min_p, p.sampling.penalty_repeat) == (0.5, 0.25, 1.5)
    untouched = to_params(parse_args(["--model", "m", "--port", "1"])).sampling
    assert untouched.temp == pytest.approx(0.8) and untouched.top_k == 40  # llama.cpp's own
    with pytest.raises(SystemExit):
        parse_args(["--model", "m", "--port", "1", "--top-k", "many"])


def test_native_worker_reads_its_key_from_the_environment(monkeypatch):
    from workers.llama import API_KEY_ENV, parse_args

    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert parse_args(["--model", "m", "--port", "1"]).api_key == "from-env"
    with pytest.raises(SystemExit):
        parse_args(["--model", "m", "--port", "1", "--no-such-flag"])


def test_the_settings_give_every_llama_model_its_ram_prompt_cache():
    settings = Settings(llama_cache_ram_mb=512)
    assert flags_of(backend(settings=settings).server_flags(1, None))["--cache-ram"] == "512"
    mine = backend(settings=settings, cache_ram_mb=64).server_flags(1, None)
    assert flags_of(mine)["--cache-ram"] == "64"  # the manifest's own wins


def test_a_generating_model_gets_a_shelf_for_its_saved_slots(tmp_path):
    from model_boss.backends.llama.prompt_cache import PromptCache

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    cache = PromptCache(tmp_path / "cache", 100, 512, 5)

    def shelf(cls=NativeLlamaBackend, **fields) -> str | None:
        made = cls(CatalogEntry(ModelManifest(id="m", path=str(gguf), **fields), gguf),
                   Settings())
        made.prompt_cache = cache
        return flags_of(made.server_flags(1, None)).get("--slot-save-path")

    chat = shelf()
    assert chat is not None and Path(chat).parent.parent == cache.root
    assert shelf(ctx_size=8192) != chat and shelf(cache_type_k="q8_0") != chat
    assert shelf(embeddings=True) is None and shelf(reranking=True) is None
    cache.bound_bytes = 0  # prompt_cache_mb: 0
    assert shelf() is None
