"""Pull sources and the file a pull picks, as tables; a pull that would not fit on the disk,
and a cancelled one, against the hub stand-in."""

from __future__ import annotations

import threading

import pytest

from model_boss.catalog import pull as pull_module
from model_boss.catalog.pull import (
    NoRoom,
    PullCancelled,
    PullSource,
    choose_files,
    parse_source,
    pull_files,
)
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
