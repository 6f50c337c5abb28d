"""A diffusers repository pulled as the pipeline folder the worker loads: the files chosen, as
a table over the layouts repositories have, and a pull against the hub stand-in."""

from __future__ import annotations

import json
import threading

import pytest

from model_boss.catalog import Catalog
from model_boss.catalog.discovery import discover, scan
from model_boss.catalog.pulls.download import PullCancelled, parse_source, pull_files
from model_boss.catalog.pulls.pipeline import (
    UnservablePipeline,
    choose_pipeline_files,
    is_pipeline_repo,
    read_index,
)
from tests.hub_standin import HubStandin

SD_INDEX = {"_class_name": "StableDiffusionPipeline", "_diffusers_version": "0.30.0",
            "unet": ["diffusers", "UNet2DConditionModel"],
            "vae": ["diffusers", "AutoencoderKL"],
            "text_encoder": ["transformers", "CLIPTextModel"],
            "tokenizer": ["transformers", "CLIPTokenizer"],
            "scheduler": ["diffusers", "PNDMScheduler"],
            "safety_checker": [None, None], "feature_extractor": [None, None],
            "requires_safety_checker": False}
# stable-diffusion-v1-5's layout: every format and variant a repository ships
SD_REPO = [
    ".gitattributes", "README.md", "model_index.json", "v1-5-pruned.safetensors",
    "v1-5-pruned-emaonly.ckpt", "sample.png",
    "unet/config.json", "unet/diffusion_pytorch_model.safetensors",
    "unet/diffusion_pytorch_model.bin", "unet/diffusion_pytorch_model.fp16.safetensors",
    "unet/diffusion_pytorch_model.non_ema.safetensors",
    "unet/diffusion_pytorch_model.fp16.bin", "unet/diffusion_flax_model.msgpack",
    "vae/config.json", "vae/diffusion_pytorch_model.safetensors",
    "vae/diffusion_pytorch_model.fp16.safetensors",
    "text_encoder/config.json", "text_encoder/model.safetensors",
    "text_encoder/model.fp16.safetensors", "text_encoder/pytorch_model.bin",
    "text_encoder/flax_model.msgpack",
    "tokenizer/merges.txt", "tokenizer/special_tokens_map.json",
    "tokenizer/tokenizer_config.json", "tokenizer/vocab.json",
    "scheduler/scheduler_config.json",
    "safety_checker/config.json", "safety_checker/model.safetensors",
    "feature_extractor/preprocessor_config.json",
]
SD_CHOSEN = ["model_index.json", "unet/config.json", "unet/diffusion_pytorch_model.safetensors",
             "vae/config.json", "vae/diffusion_pytorch_model.safetensors",
             "text_encoder/config.json", "text_encoder/model.safetensors",
             "tokenizer/merges.txt", "tokenizer/special_tokens_map.json",
             "tokenizer/tokenizer_config.json", "tokenizer/vocab.json",
             "scheduler/scheduler_config.json"]
SHARDED_INDEX = {"_class_name": "FluxPipeline",
                 "transformer": ["diffusers", "FluxTransformer2DModel"],
                 "text_encoder_2": ["transformers", "T5EncoderModel"],
                 "tokenizer_2": ["transformers", "T5TokenizerFast"]}


@pytest.mark.parametrize(("files", "index", "chosen"), [
    (SD_REPO, SD_INDEX, SD_CHOSEN),  # full precision, safetensors, no skipped component
    (["model_index.json", "unet/config.json", "unet/diffusion_pytorch_model.bin",
      "vae/config.json", "vae/diffusion_pytorch_model.safetensors",
      "vae/diffusion_pytorch_model.bin"],
     {"_class_name": "P", "unet": ["diffusers", "U"], "vae": ["diffusers", "V"]},
     ["model_index.json", "unet/config.json", "unet/diffusion_pytorch_model.bin",
      "vae/config.json", "vae/diffusion_pytorch_model.safetensors"]),  # per component
    (["model_index.json", "transformer/config.json",
      "transformer/diffusion_pytorch_model-00001-of-00002.safetensors",
      "transformer/diffusion_pytorch_model-00002-of-00002.safetensors",
      "transformer/diffusion_pytorch_model.safetensors.index.json",
      "transformer/diffusion_pytorch_model.fp16-00001-of-00001.safetensors",
      "transformer/diffusion_pytorch_model.safetensors.index.fp16.json",
      "text_encoder_2/config.json", "text_encoder_2/model-00001-of-00002.safetensors",
      "text_encoder_2/model-00002-of-00002.safetensors",
      "text_encoder_2/model.safetensors.index.json",
      "tokenizer_2/spiece.model", "tokenizer_2/tokenizer.json", "tokenizer_2/.hidden",
      "flux1-dev.safetensors", "ae.safetensors"],
     SHARDED_INDEX,
     ["model_index.json", "transformer/config.json",
      "transformer/diffusion_pytorch_model-00001-of-00002.safetensors",
      "transformer/diffusion_pytorch_model-00002-of-00002.safetensors",
      "transformer/diffusion_pytorch_model.safetensors.index.json",
      "text_encoder_2/config.json", "text_encoder_2/model-00001-of-00002.safetensors",
      "text_encoder_2/model-00002-of-00002.safetensors",
      "text_encoder_2/model.safetensors.index.json",
      "tokenizer_2/spiece.model", "tokenizer_2/tokenizer.json"]),  # shards, single files left
])
def test_the_files_a_pipeline_pull_takes(files, index, chosen):
    assert is_pipeline_repo(files)
    assert choose_pipeline_files(files, index, "o/p") == chosen


@pytest.mark.parametrize(("files", "found"), [
    (["model_index.json", "unet/config.json", "unet/diffusion_pytorch_model.fp16.safetensors"],
     "diffusion_pytorch_model.fp16.safetensors"),  # a variant alone
    (["model_index.json", "unet/config.json", "unet/diffusion_flax_model.msgpack"],
     "diffusion_flax_model.msgpack"),  # another runtime's alone
])
def test_a_component_with_no_weights_loaded_by_default_is_refused_naming_them(files, found):
    with pytest.raises(UnservablePipeline) as refused:
        choose_pipeline_files(files, {"_class_name": "P", "unet": ["diffusers", "U"]}, "o/p")
    assert refused.value.status_code == 422 and refused.value.code == "unsupported_model"
    assert "o/p's unet/" in refused.value.message and found in refused.value.message


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'{"unet": ["diffusers", "U"]}'])
def test_an_index_naming_no_pipeline_is_refused(raw):
    with pytest.raises(UnservablePipeline, match="names no pipeline class"):
        read_index(raw, "o/p")


@pytest.mark.parametrize("files", [["model_index.json", "sd-Q4_0.gguf"], ["config.json"],
                                   ["unet/model_index.json"]])
def test_what_is_not_pulled_as_a_pipeline(files):
    assert not is_pipeline_repo(files)


TINY = {"model_index.json": json.dumps({
            "_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "U"],
            "scheduler": ["diffusers", "DDIMScheduler"], "safety_checker": [None, None]}).encode(),
        "unet/config.json": b"{}", "unet/diffusion_pytorch_model.safetensors": b"\0" * 400_000,
        "unet/diffusion_pytorch_model.fp16.safetensors": b"\1" * 200_000,
        "scheduler/scheduler_config.json": b"{}", "README.md": b"# tiny\n"}


@pytest.fixture
def pipeline_hub():
    with HubStandin() as standin:
        for name, data in TINY.items():
            standin.add_file("o/tiny-sd", name, data)
        standin.add_file("o/fp16-only", "model_index.json", TINY["model_index.json"])
        standin.add_file("o/fp16-only", "unet/diffusion_pytorch_model.fp16.safetensors",
                         b"\1" * 200_000)
        yield standin


def test_a_pipeline_is_pulled_as_its_folder_and_discovered_as_a_pipeline(pipeline_hub,
                                                                         tmp_path):
    reports = []
    folder = pull_files(parse_source("hf://o/tiny-sd"), tmp_path, reports.append,
                        threading.Event(), endpoint=pipeline_hub.url)
    assert folder == tmp_path / "o" / "tiny-sd"
    got = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert got == ["model_index.json", "scheduler/scheduler_config.json", "unet/config.json",
                   "unet/diffusion_pytorch_model.safetensors"]
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["tiny-sd"]  # no staging
    assert {r["file"] for r in reports if r["status"] == "verifying"} == set(got)
    gets = [r.path for r in pipeline_hub.requests if r.method == "GET" and "/resolve/" in r.path]
    assert not any("fp16" in path or "README" in path for path in gets)
    found = {e.manifest.id: e.manifest for e in Catalog(discover(tmp_path, 4096), tmp_path)}
    assert (str(found["tiny-sd"].category), found["tiny-sd"].backend, found["tiny-sd"].source) \
        == ("diffusion", "diffusers", "pulled")


def test_a_pipeline_cut_short_is_never_seen_and_the_next_pull_resumes_it(pipeline_hub,
                                                                        tmp_path):
    cancel = threading.Event()

    def report(item):
        if item["status"] == "downloading" and item["file"].startswith("unet/diffusion"):
            cancel.set()

    with pytest.raises(PullCancelled):
        pull_files(parse_source("hf://o/tiny-sd"), tmp_path, report, cancel,
                   endpoint=pipeline_hub.url)
    assert scan(tmp_path) == []  # half a pipeline is not a model
    pipeline_hub.requests.clear()
    folder = pull_files(parse_source("hf://o/tiny-sd"), tmp_path, lambda r: None,
                        threading.Event(), endpoint=pipeline_hub.url)
    weights = folder / "unet" / "diffusion_pytorch_model.safetensors"
    assert weights.read_bytes() == TINY["unet/diffusion_pytorch_model.safetensors"]
    ranges = [r.range for r in pipeline_hub.requests
              if r.method == "GET" and r.path.endswith("/diffusion_pytorch_model.safetensors")]
    assert ranges and ranges[0].startswith("bytes=") and ranges[0] != "bytes=0-", ranges


def test_a_pipeline_the_worker_could_not_load_is_refused_before_its_weights(pipeline_hub,
                                                                           tmp_path):
    with pytest.raises(UnservablePipeline, match="fp16"):
        pull_files(parse_source("hf://o/fp16-only"), tmp_path, lambda r: None,
                   threading.Event(), endpoint=pipeline_hub.url)
    assert not any(r.method == "GET" and r.path.endswith(".safetensors")
                   for r in pipeline_hub.requests)
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
