"""Pulling a GGUF model (or a transformers model's folder, :mod:`.folder`, or a diffusers
pipeline's, :mod:`.pipeline`) from the Hugging Face Hub into ``models_dir``, resolved through
the real
``huggingface_hub`` client (the file list, sizes, checksums and URLs; HF_TOKEN, HF_ENDPOINT or
the ``hf_endpoint`` setting honoured; a file already in the hub cache is taken from there).

A pull checks the disk first, then writes each file to ``models_dir/ORG/REPO/FILE.partial``:
a dropped connection is retried, continuing where it stopped, and a pull that gave up (or was
cancelled, or whose coordinator stopped) leaves its ``.partial`` for the next pull of the same
file to continue with a Range request. (``hf_hub_download`` deletes its partial file when it
gives up, and checks only the size.) The whole file is verified against the hub's checksum
(sha256 for LFS files, the git blob hash otherwise) and only then renamed to its name:
discovery never sees half a file. The pull is recorded in ``models_dir/.model-boss-pulls.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import (
    BadRequest,
    Forbidden,
    ModelBossError,
    ModelNotFound,
    UpstreamError,
    network_reason,
)
from ..discovery import PULLS_FILE, SPLIT, read_pulls, transformers_kind
from ..hub_reach import HubRetries, HubUnavailable, hub_endpoint, unreachable
from ..hub_source import InvalidHubName, PullSource
from ..hub_source import parse_source as parse_source  # where its callers import it from
from .folder import choose_folder_files, is_folder_repo
from .pipeline import (
    INDEX,
    UnservablePipeline,
    choose_pipeline_files,
    is_pipeline_repo,
    read_index,
)

Report = Callable[[dict[str, Any]], None]
# the quantization picked when a repository holds several and the source names none
PREFERRED_QUANTS = ("Q4_K_M", "Q4_K_S", "Q4_0", "Q5_K_M", "Q8_0", "F16")
_records = threading.Lock()
DOWNLOAD_TRIES = 5  # dropped connections in a row (no byte between) before a pull gives up


class PullCancelled(ModelBossError):
    status_code = 409
    error_type = "invalid_request_error"
    code = "pull_cancelled"


class NoRoom(ModelBossError):
    status_code = 507
    error_type = "server_error"
    code = "insufficient_storage"


def _has_quant(name: str, quant: str) -> bool:
    stem = Path(name).name[:-len(".gguf")]
    return re.search(rf"(^|[-._]){re.escape(quant)}($|[-._])", stem, re.IGNORECASE) is not None


def choose_files(files: list[str], source: PullSource) -> list[str]:
    """The files to fetch for ``source``: the model (every part of a split one) and, when the
    repository has one and no file was named, a vision projector (``mmproj``, f16
    preferred)."""
    models = [f for f in files if f.lower().endswith(".gguf")
              and not Path(f).name.lower().startswith("mmproj")]
    firsts = [f for f in models if not (m := SPLIT.match(Path(f).name[:-5]))
              or int(m["part"]) == 1]
    if source.filename:
        chosen = [source.filename] if source.filename in files else []
    elif source.quant:
        chosen = [f for f in firsts if _has_quant(f, source.quant)]
    elif len(firsts) == 1:
        chosen = firsts
    else:
        chosen = next(([f for f in firsts if _has_quant(f, q)] for q in PREFERRED_QUANTS
                       if any(_has_quant(f, q) for f in firsts)), [])
    if len(chosen) != 1:
        names = ", ".join(Path(f).name for f in firsts) or "none"
        what = "matches" if chosen else "is"
        raise ModelNotFound(f"no single GGUF file in {source.repo} {what} {source} "
                            f"(its GGUF files: {names})", param="source")
    first = chosen[0]
    split = SPLIT.match(Path(first).name[:-5])
    parts = [first]
    if split:
        prefix = str(Path(first).parent / split["name"]).removeprefix("./")
        parts = sorted(f for f in models if (m := SPLIT.match(Path(f).name[:-5]))
                       and str(Path(f).parent / m["name"]).removeprefix("./") == prefix)
    projectors = sorted((f for f in files if Path(f).name.lower().startswith("mmproj")
                         and f.lower().endswith(".gguf")), key=lambda f: "f16" not in f.lower())
    return parts if source.filename else parts + projectors[:1]  # a named file: only it


def _hub_error(exc: Exception, source: PullSource, endpoint: str,
               tries: int) -> ModelBossError:
    from huggingface_hub import errors

    if isinstance(exc, errors.GatedRepoError):
        return Forbidden(f"{source.repo} is gated on the hub: accept its terms and set "
                         "HF_TOKEN", param="source")
    if isinstance(exc, (errors.RepositoryNotFoundError, errors.RevisionNotFoundError,
                        errors.EntryNotFoundError)):
        return ModelNotFound(f"not found on the hub: {source} (a private repository needs "
                             "HF_TOKEN)", param="source")
    if isinstance(exc, errors.HFValidationError):
        return InvalidHubName(f"cannot pull {source}: {exc}", param="source")
    if isinstance(exc, errors.HfHubHTTPError) and exc.response is not None:
        status = exc.response.status_code
        if status in (401, 403):
            return Forbidden(f"the hub refused {source}: set HF_TOKEN", param="source")
        return HubUnavailable(f"the hub at {endpoint} answered {status} for {source}",
                              retry_after_s=30)
    return unreachable(exc, str(source), endpoint, tries)


def _digest(etag: str | None) -> str:
    """The file's sha256 as Ollama writes a digest (``sha256:HEX``), when the hub gave it."""
    etag = _plain(etag)
    return f"sha256:{etag}" if len(etag) == 64 else ""


def _plain(etag: str | None) -> str:
    return (etag or "").removeprefix("W/").strip('"')


def _hasher(etag: str | None, size: int):
    """What the hub's checksum is: sha256 for LFS files, git's blob hash otherwise."""
    return hashlib.sha256() if len(_plain(etag)) == 64 else hashlib.sha1(b"blob %d\0" % size)


def _free_mb(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free >> 20


@dataclass(slots=True)
class _File:
    """One file to fetch: where it comes from, how big it is, its checksum, where it goes."""

    name: str
    url: str
    size: int
    etag: str | None
    dest: Path

    @property
    def partial(self) -> Path:
        return self.dest.with_name(self.dest.name + ".partial")


def pull_files(source: PullSource, models_dir: Path, report: Report,
               cancelled: threading.Event, endpoint: str | None = None) -> Path:
    """Fetch ``source`` into ``models_dir``; the model file (a split one's first part), or a
    transformers model's or a diffusers pipeline's folder."""
    from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    hub = hub_endpoint(endpoint)
    report({"status": "resolving", "source": str(source), "endpoint": hub})
    try:
        with HubRetries(report) as retries:
            files = [source.filename] if source.filename else \
                HfApi(endpoint=endpoint).list_repo_files(source.repo)
            named = bool(source.filename or source.quant)
            pipeline = not named and is_pipeline_repo(files)
            whole = pipeline or (not named and is_folder_repo(files))
            # a folder is fetched into ORG/REPO.partial (discovery does not see it) and named
            # ORG/REPO once every file is there and verified
            folder = models_dir / source.repo
            into = folder.with_name(folder.name + ".partial") if whole else folder
            headers = build_hf_headers(library_name="model-boss")

            def file(name: str) -> _File:
                meta = get_hf_file_metadata(hf_hub_url(source.repo, name, endpoint=endpoint))
                return _File(name, meta.location, meta.size or 0, meta.etag, into / name)

            if whole and folder.exists():
                raise _already_pulled(source, models_dir)
            if pipeline:  # its index names the components, so it comes first
                index = file(INDEX)
                _fetch(source, index, headers, report, cancelled)
                try:
                    names = choose_pipeline_files(
                        files, read_index(index.dest.read_bytes(), source.repo), source.repo)
                except UnservablePipeline:
                    shutil.rmtree(into, ignore_errors=True)
                    raise
            else:
                names = choose_folder_files(files) if whole else choose_files(files, source)
            wanted = [file(name) for name in names if not (pipeline and name == INDEX)]
    except ModelBossError:
        raise
    except Exception as exc:
        raise _hub_error(exc, source, hub, max(1, retries.tries)) from exc
    need_mb = sum(f.size - _size(f.partial) for f in wanted) >> 20
    if _free_mb(models_dir) < need_mb + 64:
        raise NoRoom(f"{source} needs {need_mb} MB; {models_dir} has "
                     f"{_free_mb(models_dir)} MB free", retry_after_s=60)
    checked = not whole or pipeline  # a pipeline's index was read before any weights came
    for item in sorted(wanted, key=lambda f: (not f.name.endswith(".json"), f.size)):
        if not checked and not item.name.endswith(".json"):  # its configs say its kind
            _check_kind(source, into, [f.name for f in wanted])
            checked = True
        _fetch(source, item, headers, report, cancelled)
    if not checked:
        _check_kind(source, into, [f.name for f in wanted])
    placed = [folder] if whole else [f.dest for f in wanted]
    if whole:
        os.replace(into, folder)
    _record(models_dir, placed, source, [None] if whole else [f.etag for f in wanted])
    report({"status": "placed", "file": placed[0].relative_to(models_dir).as_posix()})
    return placed[0]


def _already_pulled(source: PullSource, models_dir: Path) -> BadRequest:
    return BadRequest(f"{source.repo} is in {models_dir.name} already: remove it first "
                      "(DELETE /api/v1/models/NAME) to pull it again", status_code=409,
                      param="source", code="already_pulled")


def _fetch(source: PullSource, file: _File, headers: dict[str, str], report: Report,
           cancelled: threading.Event) -> None:
    """One file to its place: from the hub cache when it is there whole, else downloaded
    (resuming its ``.partial``), then verified and renamed."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(source.repo, file.name)
    if isinstance(cached, str) and Path(cached).stat().st_size == file.size:
        _link(Path(cached), file.partial)  # the hub cache has it already
    _download(file, headers, report, cancelled)
    report({"status": "verifying", "file": file.name})
    _verify(file)
    os.replace(file.partial, file.dest)


def _check_kind(source: PullSource, into: Path, names: list[str]) -> None:
    """Before the weights come: a folder the transformers worker would not serve is refused
    (and what was fetched of it deleted)."""
    if transformers_kind(into, names) is None:
        shutil.rmtree(into, ignore_errors=True)
        raise BadRequest(f"{source.repo} is no embedder, reranker, speech recogniser or voice "
                         "the transformers worker serves (for a chat model, pull a GGUF "
                         "repository)", status_code=422, param="source",
                         code="unsupported_model")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _link(cached: Path, partial: Path) -> None:
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.unlink(missing_ok=True)
    try:
        os.link(cached.resolve(), partial)
    except OSError:
        shutil.copyfile(cached, partial)


def _download(file: _File, headers: dict[str, str], report: Report,
              cancelled: threading.Event) -> None:
    """Bring ``file.partial`` to the whole file: a part already there (an earlier pull cut
    short) is continued with a Range request; a dropped connection is retried, resuming."""
    import httpx

    file.partial.parent.mkdir(parents=True, exist_ok=True)
    have = _size(file.partial)
    if have > file.size:
        file.partial.unlink()
        have = 0
    failures, sent = 0, 0.0
    while have < file.size:
        ranged = {"Range": f"bytes={have}-"} if have else {}
        try:
            with httpx.stream("GET", file.url, headers={**headers, **ranged}, timeout=60,
                              follow_redirects=True) as response:
                if response.status_code == 200 and have:  # the range was ignored
                    have = 0
                elif response.status_code not in (200, 206):
                    raise HubUnavailable(f"the hub answered {response.status_code} for "
                                         f"{file.name}", retry_after_s=30)
                with open(file.partial, "r+b" if have else "wb") as out:
                    out.seek(have)
                    out.truncate()
                    for chunk in response.iter_bytes():  # as they come: a cut loses none
                        if cancelled.is_set():
                            raise PullCancelled(f"pull of {file.name} cancelled at {have} of "
                                                f"{file.size} bytes; pull again to resume")
                        out.write(chunk)
                        have += len(chunk)
                        failures = 0
                        if time.monotonic() - sent >= 0.25 or have >= file.size:
                            sent = time.monotonic()
                            report({"status": "downloading", "file": file.name,
                                    "digest": _digest(file.etag), "completed": have,
                                    "total": file.size})
        except httpx.TransportError as exc:
            have = _size(file.partial)
            failures += 1
            if failures > DOWNLOAD_TRIES:
                raise HubUnavailable(f"download of {file.name} interrupted at {have} of "
                                     f"{file.size} bytes ({network_reason(exc)}); pull "
                                     "again to resume", retry_after_s=10) from exc
            report({"status": "retrying", "file": file.name, "attempt": failures,
                    "of": DOWNLOAD_TRIES, "wait_s": 0.2 * failures,
                    "reason": network_reason(exc)})
            time.sleep(0.2 * failures)


def _verify(file: _File) -> None:
    """The whole file against the hub's checksum; a mismatch deletes it (the next pull
    downloads it again)."""
    digest = _hasher(file.etag, file.size)
    if _plain(file.etag) and len(_plain(file.etag)) in (40, 64):
        with open(file.partial, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
        if digest.hexdigest() != _plain(file.etag):
            file.partial.unlink(missing_ok=True)
            raise UpstreamError(f"{file.name} failed its checksum (the hub says "
                                f"{_plain(file.etag)[:12]}…); it was deleted: pull again")
    if _size(file.partial) != file.size:
        raise UpstreamError(f"{file.name} has {_size(file.partial)} bytes, not {file.size}")


def _record(models_dir: Path, placed: list[Path], source: PullSource,
            etags: list[str | None]) -> None:
    with _records:
        pulls = read_pulls(models_dir)
        for path, etag in zip(placed, etags, strict=True):
            pulls[path.relative_to(models_dir).as_posix()] = {
                "source": str(source), "checksum": (etag or "").strip('"'),
                "pulled_at": time.time()}
        write_pulls(models_dir, pulls)


def write_pulls(models_dir: Path, pulls: dict[str, Any]) -> None:
    tmp = models_dir / (PULLS_FILE + ".tmp")
    tmp.write_text(json.dumps(pulls, indent=1, sort_keys=True))
    os.replace(tmp, models_dir / PULLS_FILE)


def forget_pulls(models_dir: Path, removed: list[Path]) -> None:
    """Drop removed files from the pulls' record."""
    with _records:
        pulls = read_pulls(models_dir)
        for path in removed:
            with_rel = path.relative_to(models_dir).as_posix() \
                if path.is_relative_to(models_dir) else None
            pulls.pop(with_rel or "", None)
        if (models_dir / PULLS_FILE).exists():
            write_pulls(models_dir, pulls)
