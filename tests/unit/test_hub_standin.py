"""The hub stand-in, driven by the real ``huggingface_hub`` client (no network).

These tests also pin down what the installed client does on an interrupted download: it
retries and resumes inside one ``hf_hub_download`` call (a ``Range: bytes=N-`` GET, N a multiple
of ``constants.DOWNLOAD_CHUNK_SIZE``, since bytes short of a whole chunk are dropped), and once it
gives up it deletes its partial file, so the next call starts again from byte 0.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import types
from pathlib import Path

import httpx
import httpx2
import pytest
from huggingface_hub import HfApi, file_download, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import (
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from tests.hub_standin import COMMIT, HubStandin

REPO = "org/model"
NAME = "model.Q4.gguf"
DATA = os.urandom(2_000_000)
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def hub():
    with HubStandin() as standin:
        standin.add_file(REPO, NAME, DATA)
        standin.add_file(REPO, "config/params.json", b'{"ctx": 4096}')
        yield standin


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """The client's waits between download retries, recorded instead of slept."""
    waits: list[float] = []
    monkeypatch.setattr(file_download, "time", types.SimpleNamespace(sleep=waits.append))
    return waits


def download(hub: HubStandin, cache: Path, filename: str = NAME, **kwargs) -> Path:
    kwargs.setdefault("token", False)
    return Path(hf_hub_download(REPO, filename, endpoint=hub.url, cache_dir=cache, **kwargs))


def gets(hub: HubStandin, filename: str = NAME) -> list[str | None]:
    """The Range header of every GET of ``filename`` so far."""
    return [seen.range for seen in hub.requests
            if seen.method == "GET" and seen.path.endswith(f"/resolve/main/{filename}")]


def test_model_info_and_list_repo_files(hub):
    api = HfApi(endpoint=hub.url, token=False)
    assert sorted(api.list_repo_files(REPO)) == ["config/params.json", NAME]
    assert api.list_repo_files(REPO, revision=COMMIT) == api.list_repo_files(REPO)

    info = api.model_info(REPO, files_metadata=True)
    assert info.id == REPO and info.sha == COMMIT
    siblings = {s.rfilename: s for s in info.siblings}
    assert siblings[NAME].size == len(DATA)
    assert siblings[NAME].lfs.sha256 == SHA
    assert api.model_info(REPO, revision=COMMIT).sha == COMMIT


def test_download_and_metadata(hub, tmp_path):
    path = download(hub, tmp_path)
    assert path.read_bytes() == DATA
    assert path.parent.name == COMMIT and path.resolve().name == SHA  # snapshots/ -> blobs/
    assert [(s.method, s.range) for s in hub.requests] == [("HEAD", None), ("GET", None)]
    assert download(hub, tmp_path, revision=COMMIT) == path  # cached: no request at all
    assert len(hub.requests) == 2

    meta = get_hf_file_metadata(hf_hub_url(REPO, NAME, endpoint=hub.url), token=False)
    assert (meta.commit_hash, meta.etag, meta.size) == (COMMIT, SHA, len(DATA))


def test_serves_files_from_disk_and_ranges(hub, tmp_path):
    big = tmp_path / "big.gguf"
    big.write_bytes(DATA[::-1])
    assert hub.add_file(REPO, "big.gguf", big) == hashlib.sha256(DATA[::-1]).hexdigest()
    assert download(hub, tmp_path / "cache", "big.gguf").read_bytes() == DATA[::-1]

    url = hf_hub_url(REPO, "big.gguf", endpoint=hub.url)
    part = httpx.get(url, headers={"Range": "bytes=1000-"})
    assert part.status_code == 206 and part.content == DATA[::-1][1000:]
    assert part.headers["Content-Range"] == f"bytes 1000-{len(DATA) - 1}/{len(DATA)}"
    assert httpx.get(url, headers={"Range": f"bytes={len(DATA)}-"}).status_code == 416


def test_cut_download_resumes_within_one_call(hub, tmp_path, sleeps, monkeypatch):
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    hub.cut_after(NAME, 500_000)
    assert download(hub, tmp_path).read_bytes() == DATA
    first, resumed = gets(hub)
    assert first is None
    assert resumed == "bytes=458752-"  # 7 whole 64 KiB chunks were written before the cut
    assert sleeps == [1]


def test_cut_before_a_whole_chunk_restarts_from_zero(hub, tmp_path, sleeps):
    hub.cut_after(NAME, 1_000_000)  # less than the default 10 MiB chunk: nothing was written
    assert download(hub, tmp_path).read_bytes() == DATA
    assert gets(hub) == [None, None]
    assert sleeps == [1]


def test_download_cut_past_retries_raises_then_starts_over(hub, tmp_path, sleeps, monkeypatch):
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    hub.cut_after(NAME, 500_000)  # progress, which resets the client's 5 retries ...
    hub.cut_after(NAME, 0, times=5)  # ... then 5 cuts without progress: it gives up
    with pytest.raises(httpx2.RemoteProtocolError):
        download(hub, tmp_path)
    assert gets(hub) == [None] + ["bytes=458752-"] * 5
    assert sleeps == [1] * 5
    blobs = tmp_path / "models--org--model" / "blobs"
    assert list(blobs.iterdir()) == []  # no blob, and no .incomplete file kept to resume from

    hub.requests.clear()
    assert download(hub, tmp_path).read_bytes() == DATA
    assert gets(hub) == [None]  # the next call downloads from byte 0


def test_corrupt_bytes_are_not_caught_by_the_client(hub, tmp_path):
    hub.corrupt(NAME)
    path = download(hub, tmp_path)
    assert path.stat().st_size == len(DATA)
    assert hashlib.sha256(path.read_bytes()).hexdigest() != SHA  # yet it sits in blobs/<SHA>
    assert path.resolve().name == SHA


def test_unknown_repo_revision_and_file(hub, tmp_path):
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("org/nope", NAME, endpoint=hub.url, cache_dir=tmp_path, token=False)
    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=hub.url, token=False).model_info("org/nope")
    with pytest.raises(RevisionNotFoundError):
        download(hub, tmp_path, revision="v9")
    with pytest.raises(RemoteEntryNotFoundError):
        download(hub, tmp_path, "missing.gguf")


def test_token_protected_repo(hub, tmp_path):
    hub.add_file("org/private", NAME, DATA)
    hub.require_token("org/private", "hf_secret")
    fetch = {"repo_id": "org/private", "filename": NAME, "endpoint": hub.url,
             "cache_dir": tmp_path}
    with pytest.raises(RepositoryNotFoundError) as missing:
        hf_hub_download(**fetch, token=False)
    assert missing.value.response.status_code == 401
    with pytest.raises(HfHubHTTPError) as wrong:
        hf_hub_download(**fetch, token="hf_wrong")
    assert wrong.value.response.status_code == 401
    assert Path(hf_hub_download(**fetch, token="hf_secret")).read_bytes() == DATA
    info = HfApi(endpoint=hub.url, token="hf_secret").model_info("org/private")
    assert info.private is True


def test_subprocess_client_uses_the_environment(hub, tmp_path):
    code = ("from huggingface_hub import hf_hub_download as d, HfApi;"
            f"print(d({REPO!r}, {NAME!r})); print(HfApi().model_info({REPO!r}).sha)")
    env = {**os.environ, **hub.hf_env(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert Path(out[0]).read_bytes() == DATA
    assert Path(out[0]).is_relative_to(tmp_path / "hub")
    assert out[1] == COMMIT
