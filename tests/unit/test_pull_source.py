"""Pull sources and the file a pull picks, as tables; a pull that would not fit on the disk,
and a cancelled one, against the hub stand-in."""

from __future__ import annotations

import threading

import pytest

from model_boss.catalog import Catalog
from model_boss.catalog.discovery import discover, scan
from model_boss.catalog.hub_source import InvalidHubName, name_problem
from model_boss.catalog.pulls import download as pull_module
from model_boss.catalog.pulls.download import (
    NoRoom,
    PullCancelled,
    PullSource,
    choose_files,
    parse_source,
    pull_files,
)
from model_boss.catalog.pulls.folder import choose_folder_files
from model_boss.errors import BadRequest, ModelNotFound
from tests.hub_standin import HubStandin


@pytest.mark.parametrize(("text", "expected"), [
    ("hf://org/repo/file.gguf", PullSource("org/repo", "file.gguf")),
    ("hf://org/repo/sub/dir/file.Q4_K_M.gguf", PullSource("org/repo", "sub/dir/file.Q4_K_M.gguf")),
    ("hf://org/repo:Q4_K_M", PullSource("org/repo", quant="Q4_K_M")),
    ("hf://org/repo", PullSource("org/repo")),
    ("hf.co/bartowski/Qwen2.5-0.5B-Instruct-GGUF:IQ4_XS",
     PullSource("bartowski/Qwen2.5-0.5B-Instruct-GGUF", quant="IQ4_XS")),
    ("  https://huggingface.co/org/repo:q8_0 ", PullSource("org/repo", quant="q8_0")),
])
def test_sources_parse(text, expected):
    assert parse_source(text) == expected


@pytest.mark.parametrize("text", ["llama3", "ftp://x/y", "hf://just-org", "hf://org/repo/x.bin",
                                  "hf://org/repo/../etc/passwd.gguf", "hf://a/b:Q4 K", "", 7])
def test_bad_sources_are_400(text):
    with pytest.raises(BadRequest, match="cannot pull"):
        parse_source(text)


REPO = ["README.md", "m-Q4_K_M.gguf", "m-Q8_0.gguf", "m-IQ4_K_M.gguf", "mmproj-m-f32.gguf",
        "mmproj-m-f16.gguf", "big/m-Q6_K-00001-of-00002.gguf", "big/m-Q6_K-00002-of-00002.gguf"]


@pytest.mark.parametrize(("source", "files"), [
    ("hf://o/r:Q4_K_M", ["m-Q4_K_M.gguf", "mmproj-m-f16.gguf"]),  # not IQ4_K_M
    ("hf://o/r:q8_0", ["m-Q8_0.gguf", "mmproj-m-f16.gguf"]),
    ("hf://o/r:Q6_K", ["big/m-Q6_K-00001-of-00002.gguf", "big/m-Q6_K-00002-of-00002.gguf",
                       "mmproj-m-f16.gguf"]),
    ("hf://o/r", ["m-Q4_K_M.gguf", "mmproj-m-f16.gguf"]),  # the preferred quantization
    ("hf://o/r/m-Q8_0.gguf", ["m-Q8_0.gguf"]),
])
def test_the_files_a_pull_picks(source, files):
    assert choose_files(REPO, parse_source(source)) == files


@pytest.mark.parametrize("source", ["hf://o/r:Q2_K", "hf://o/r/nope.gguf"])
def test_no_match_is_404_listing_what_there_is(source):
    with pytest.raises(ModelNotFound, match="m-Q8_0.gguf"):
        choose_files(REPO, parse_source(source))


def test_two_files_with_no_preferred_quantization_ask_for_one():
    with pytest.raises(ModelNotFound, match="a.gguf, b.gguf"):
        choose_files(["a.gguf", "b.gguf"], parse_source("hf://o/r"))


@pytest.fixture
def hub():
    with HubStandin() as standin:
        standin.add_file("o/r", "m-Q4_0.gguf", b"GGUF" + b"\0" * 3_000_000)
        yield standin


def test_a_pull_that_would_not_fit_writes_nothing(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(pull_module, "_free_mb", lambda path: 10)
    with pytest.raises(NoRoom, match="needs 2 MB"):
        pull_files(parse_source("hf://o/r:Q4_0"), tmp_path, lambda r: None, threading.Event(),
                   endpoint=hub.url)
    assert list(tmp_path.iterdir()) == []
    assert [r.method for r in hub.requests if r.path.endswith(".gguf")] == ["HEAD"]


def test_a_cancelled_pull_keeps_its_part_for_the_next_one(hub, tmp_path):
    cancel = threading.Event()
    reports = []

    def report(item):
        reports.append(item)
        if item["status"] == "downloading":
            cancel.set()

    with pytest.raises(PullCancelled, match="pull again to resume"):
        pull_files(parse_source("hf://o/r:Q4_0"), tmp_path, report, cancel, endpoint=hub.url)
    partial = tmp_path / "o/r/m-Q4_0.gguf.partial"
    assert 0 < partial.stat().st_size < 3_000_004
    assert not (tmp_path / "o/r/m-Q4_0.gguf").exists()
    done = pull_files(parse_source("hf://o/r:Q4_0"), tmp_path, lambda r: None,
                      threading.Event(), endpoint=hub.url)
    assert done.read_bytes() == b"GGUF" + b"\0" * 3_000_000


EMBEDDER_REPO = {  # a sentence-transformers repository as the hub holds one
    "config.json": b'{"architectures": ["BertModel"], "model_type": "bert"}',
    "modules.json": b"[]",
    "config_sentence_transformers.json": b'{"model_type": "SentenceTransformer"}',
    "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
    "tokenizer.json": b"{}",
    "model.safetensors": b"\0" * 2_000_000,
    "pytorch_model.bin": b"\1" * 2_000_000,  # the same weights pickled: not fetched
    "onnx/model.onnx": b"\2" * 1000,
    "openvino/openvino_model.xml": b"<xml/>",
    "tf_model.h5": b"\3" * 1000,
    ".gitattributes": b"*.bin filter=lfs\n",
}


@pytest.fixture
def folder_hub():
    with HubStandin() as standin:
        for name, data in EMBEDDER_REPO.items():
            standin.add_file("o/embedder", name, data)
        standin.add_file("o/chat", "config.json", b'{"architectures": ["Qwen2ForCausalLM"]}')
        standin.add_file("o/chat", "model.safetensors", b"\0" * 1_000_000)
        yield standin


def test_a_transformers_repository_is_pulled_as_the_folder_the_worker_loads(folder_hub,
                                                                            tmp_path):
    reports = []
    folder = pull_files(parse_source("hf://o/embedder"), tmp_path, reports.append,
                        threading.Event(), endpoint=folder_hub.url)
    assert folder == tmp_path / "o" / "embedder"
    got = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert got == ["1_Pooling/config.json", "config.json", "config_sentence_transformers.json",
                   "model.safetensors", "modules.json", "tokenizer.json"]
    assert (folder / "model.safetensors").read_bytes() == EMBEDDER_REPO["model.safetensors"]
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["embedder"]  # no staging
    assert reports[-1] == {"status": "placed", "file": "o/embedder"}
    found = {e.manifest.id: e.manifest for e in Catalog(discover(tmp_path, 4096), tmp_path)}
    assert (str(found["embedder"].category), found["embedder"].source) == ("embedding",
                                                                          "pulled")
    with pytest.raises(BadRequest) as again:
        pull_files(parse_source("hf://o/embedder"), tmp_path, lambda r: None,
                   threading.Event(), endpoint=folder_hub.url)
    assert (again.value.status_code, again.value.code) == (409, "already_pulled")


def test_a_folder_cut_short_is_never_seen_and_the_next_pull_finishes_it(folder_hub, tmp_path):
    cancel = threading.Event()

    def report(item):
        if item["status"] == "downloading" and item["file"] == "model.safetensors":
            cancel.set()

    with pytest.raises(PullCancelled):
        pull_files(parse_source("hf://o/embedder"), tmp_path, report, cancel,
                   endpoint=folder_hub.url)
    assert (tmp_path / "o" / "embedder.partial" / "config.json").exists()
    assert not (tmp_path / "o" / "embedder").exists() and scan(tmp_path) == []
    folder = pull_files(parse_source("hf://o/embedder"), tmp_path, lambda r: None,
                        threading.Event(), endpoint=folder_hub.url)
    assert (folder / "model.safetensors").read_bytes() == EMBEDDER_REPO["model.safetensors"]
    resumed = [r.range for r in folder_hub.requests
               if r.method == "GET" and r.path.endswith("/model.safetensors")]
    assert resumed[0] is None and resumed[-1].startswith("bytes=") and resumed[-1] != "bytes=0-"


def test_a_repository_of_no_kind_served_is_refused_before_its_weights(folder_hub, tmp_path):
    with pytest.raises(BadRequest) as refused:
        pull_files(parse_source("hf://o/chat"), tmp_path, lambda r: None, threading.Event(),
                   endpoint=folder_hub.url)
    assert (refused.value.status_code, refused.value.code) == (422, "unsupported_model")
    assert "pull a GGUF" in refused.value.message
    assert not any(r.method == "GET" and r.path.endswith(".safetensors")
                   for r in folder_hub.requests)
    assert not (tmp_path / "o" / "chat").exists() and \
        not (tmp_path / "o" / "chat.partial").exists()


@pytest.mark.parametrize(("files", "chosen"), [
    (["config.json", "pytorch_model.bin"], ["config.json", "pytorch_model.bin"]),  # bin only
    (["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
      "model.safetensors.index.json", "pytorch_model-00001-of-00002.bin",
      "pytorch_model.bin.index.json"],
     ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
      "model.safetensors.index.json"]),
    (["config.json", "model.safetensors", "flax_model.msgpack", "coreml/x.mlmodel",
      "preprocessor_config.json", "vocab.json", "merges.txt", "README.md"],
     ["config.json", "model.safetensors", "preprocessor_config.json", "vocab.json",
      "merges.txt", "README.md"]),
])
def test_the_files_a_folder_pull_takes(files, chosen):
    assert choose_folder_files(files) == chosen


@pytest.mark.parametrize(("text", "part"), [
    ("hf://../../x.gguf", "the org '..'"),
    ("hf://org/../x.gguf", "the repo '..'"),
    ("hf.co/-org/repo:Q4_K_M", "the org '-org'"),
    ("hf://org/repo./x.gguf", "the repo 'repo.'"),
    ("hf://org/re--po", "the repo 're--po'"),
    ("hf://org/" + "r" * 97, "the repo 'rrrr"),
    ("hf://org/repo.git", "the repo 'repo.git'"),
    ("hf://org/repo/a/../x.gguf", "the file 'a/../x.gguf'"),
    ("hf://org/repo/x.bin", "the file 'x.bin'"),
    ("hf://org/repo:Q4*K", "the quantization 'Q4*K'"),
])
def test_a_source_with_a_part_the_hub_could_not_have_is_a_400_naming_it(text, part):
    with pytest.raises(InvalidHubName) as refused:
        parse_source(text)
    assert refused.value.status_code == 400 and refused.value.param == "source"
    assert part in refused.value.message and text.strip() in refused.value.message


@pytest.mark.parametrize("name", ["org", "Qwen2.5-0.5B-Instruct-GGUF", "a", "1", "a_b", "A.b",
                                  "..", "-a", "a-", ".a", "a.", "a--b", "a..b", "a b",
                                  "x.git", "r" * 96, "r" * 97, "é", ""])
def test_the_name_rules_are_the_hubs_own(name):
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
        hub_says_ok = bool(name)  # the hub's validator lets "" through as "no repo id"
    except HFValidationError:
        hub_says_ok = False
    assert (name_problem(name) is None) == hub_says_ok, name


async def test_a_bad_hub_name_is_a_400_at_once_on_both_pull_routes(tmp_path):
    from tests.unit.fakes import coordinator, manifest, started_client

    coord, _ = coordinator(tmp_path, [manifest("a", 1000)])
    with HubStandin() as hub:
        coord.settings.hf_endpoint = hub.url
        async with started_client(coord) as client:
            ollama = await client.post("/api/pull", json={"model": "hf://../../x.gguf"})
            ours = await client.post("/api/v1/models/pull", json={"source": "hf://../../x.gguf"})
        assert hub.requests == []  # nothing asked of the hub
    assert ollama.status_code == ours.status_code == 400
    assert "the org '..' is not a valid Hugging Face Hub name" in ollama.json()["error"]
    assert ours.json()["error"]["code"] == "invalid_hub_name"
    assert "the org '..'" in ours.json()["error"]["message"]
