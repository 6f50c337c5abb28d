"""Pulling a GGUF model from the Hugging Face Hub into ``models_dir``, through the real
``huggingface_hub`` client: HF_TOKEN, HF_ENDPOINT (or the ``hf_endpoint`` setting) and the hub
cache are honoured, an interrupted download resumes from the cache's ``.incomplete`` blob.

A pull checks the disk first, downloads into the hub cache, verifies each file against the
hub's checksum (sha256 for LFS files, the git blob hash otherwise), then links (or copies) it
into ``models_dir/ORG/REPO/`` under a ``.partial`` name and renames it whole: discovery never
sees half a file. The pull is recorded in ``models_dir/.model-boss-pulls.json``.
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

from ..errors import BadRequest, Forbidden, ModelBossError, ModelNotFound, UpstreamError
from .discovery import PULLS_FILE, SPLIT, read_pulls

Report = Callable[[dict[str, Any]], None]
# the quantization picked when a repository holds several and the source names none
PREFERRED_QUANTS = ("Q4_K_M", "Q4_K_S", "Q4_0", "Q5_K_M", "Q8_0", "F16")
_SOURCE = re.compile(r"^(?:hf://|hf\.co/|huggingface\.co/|https://huggingface\.co/)"
                     r"(?P<repo>[\w.-]+/[\w.-]+)(?:(?P<file>/[\w./-]+\.gguf)|:(?P<quant>[\w.-]+))?$",
                     re.IGNORECASE)
_records = threading.Lock()


class PullCancelled(ModelBossError):
    status_code = 409
    error_type = "invalid_request_error"
    code = "pull_cancelled"


class HubUnavailable(ModelBossError):
    status_code = 503
    error_type = "server_error"
    code = "hub_unavailable"


class NoRoom(ModelBossError):
    status_code = 507
    error_type = "server_error"
    code = "insufficient_storage"


@dataclass(frozen=True, slots=True)
class PullSource:
    """``hf://ORG/REPO/FILE.gguf``, ``hf://ORG/REPO:QUANT`` or ``hf://ORG/REPO`` (also
    ``hf.co/...``, Ollama's spelling)."""

    repo: str
    filename: str | None = None
    quant: str | None = None

    def __str__(self) -> str:
        tail = f"/{self.filename}" if self.filename else f":{self.quant}" if self.quant else ""
        return f"hf://{self.repo}{tail}"


def parse_source(text: str) -> PullSource:
    match = _SOURCE.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise BadRequest(f"cannot pull {text!r}: expected hf://ORG/REPO/FILE.gguf, "
                         "hf://ORG/REPO:QUANT or hf://ORG/REPO", param="source")
    file = match["file"][1:] if match["file"] else None
    if file and any(part in ("", ".", "..") for part in file.split("/")):
        raise BadRequest(f"cannot pull {text!r}: bad file path", param="source")
    return PullSource(match["repo"], file, match["quant"])


def _has_quant(name: str, quant: str) -> bool:
    stem = Path(name).name[:-len(".gguf")]
    return re.search(rf"(^|[-._]){re.escape(quant)}($|[-._])", stem, re.IGNORECASE) is not None


def choose_files(files: list[str], source: PullSource) -> list[str]:
    """The files to fetch for ``source``: the model (every part of a split one) and, when the
    repository has one, a vision projector (``mmproj``, f16 preferred)."""
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
    return parts + projectors[:1]


class _Progress:
    """The progress bar huggingface_hub draws, as reports (and the place a cancel lands)."""

    def __init__(self, report: Report, file: str, digest: str, cancelled: threading.Event,
                 total: int | None = None, initial: int = 0, **_: Any) -> None:
        self.report, self.file, self.digest, self.cancelled = report, file, digest, cancelled
        self.total, self.n, self._sent = total or 0, initial, 0.0

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def update(self, n: int) -> None:
        if self.cancelled.is_set():
            raise PullCancelled(f"pull of {self.file} cancelled")
        self.n += n
        now = time.monotonic()
        if now - self._sent >= 0.25 or self.n >= self.total:
            self._sent = now
            self.report({"status": "downloading", "file": self.file, "digest": self.digest,
                         "completed": self.n, "total": self.total})

    def close(self) -> None:
        return None


def _hub_error(exc: Exception, source: PullSource) -> ModelBossError:
    from huggingface_hub import errors

    if isinstance(exc, errors.GatedRepoError):
        return Forbidden(f"{source.repo} is gated on the hub: accept its terms and set "
                         "HF_TOKEN", param="source")
    if isinstance(exc, (errors.RepositoryNotFoundError, errors.RevisionNotFoundError,
                        errors.EntryNotFoundError)):
        return ModelNotFound(f"not found on the hub: {source} (a private repository needs "
                             "HF_TOKEN)", param="source")
    if isinstance(exc, errors.HfHubHTTPError) and exc.response is not None \
            and exc.response.status_code in (401, 403):
        return Forbidden(f"the hub refused {source}: set HF_TOKEN", param="source")
    return HubUnavailable(f"the hub could not be reached for {source}: "
                          f"{type(exc).__name__}", retry_after_s=30)


def _digest(etag: str | None) -> str:
    """The file's sha256 as Ollama writes a digest (``sha256:HEX``), when the hub gave it."""
    etag = (etag or "").strip('"')
    return f"sha256:{etag}" if len(etag) == 64 else ""


def _checksum_ok(path: Path, etag: str | None, size: int) -> bool:
    etag = (etag or "").strip('"').removeprefix("W/").strip('"')
    if len(etag) == 64:
        digest = hashlib.sha256()
    elif len(etag) == 40:
        digest = hashlib.sha1(b"blob %d\0" % size)  # git's blob hash
    else:
        return True  # no checksum to hold it against: the size was checked
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest() == etag


def _free_mb(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free >> 20


def pull_files(source: PullSource, models_dir: Path, report: Report,
               cancelled: threading.Event, endpoint: str | None = None,
               cache_dir: Path | None = None) -> Path:
    """Fetch ``source`` into ``models_dir``; the model file (a split one's first part)."""
    from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url

    report({"status": "resolving", "source": str(source)})
    try:
        files = source.filename and [source.filename] or \
            HfApi(endpoint=endpoint).list_repo_files(source.repo)
        chosen = choose_files(files, source)
        metas = [get_hf_file_metadata(hf_hub_url(source.repo, f, endpoint=endpoint))
                 for f in chosen]
    except ModelBossError:
        raise
    except Exception as exc:
        raise _hub_error(exc, source) from exc
    from huggingface_hub import constants

    need_mb = sum(m.size or 0 for m in metas) >> 20
    for where in (models_dir, Path(cache_dir or constants.HF_HUB_CACHE)):
        if _free_mb(where) < need_mb + 64:
            raise NoRoom(f"{source} needs {need_mb} MB; {where} has {_free_mb(where)} MB free")
    placed = []
    for file, meta in zip(chosen, metas, strict=True):
        try:
            cached = Path(hf_hub_download(
                source.repo, file, endpoint=endpoint, cache_dir=cache_dir,
                tqdm_class=lambda file=file, meta=meta, **kw: _Progress(
                    report, file, _digest(meta.etag), cancelled, **kw)))
        except ModelBossError:
            raise
        except Exception as exc:
            raise _hub_error(exc, source) from exc
        report({"status": "verifying", "file": file})
        if not _checksum_ok(cached, meta.etag, meta.size or 0):
            with_link = cached.resolve()
            cached.unlink(missing_ok=True)
            with_link.unlink(missing_ok=True)  # the next pull downloads it again
            raise UpstreamError(f"{file} from {source.repo} failed its checksum; it was "
                                "removed from the cache, pull again")
        placed.append(_place(cached, models_dir / source.repo / file))
    _record(models_dir, placed, source, [m.etag for m in metas])
    report({"status": "placed", "file": str(placed[0].relative_to(models_dir))})
    return placed[0]


def _place(cached: Path, dest: Path) -> Path:
    """``cached`` at ``dest``, whole: a hard link (or a copy) under ``.partial``, renamed."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    partial.unlink(missing_ok=True)
    try:
        os.link(cached.resolve(), partial)
    except OSError:
        shutil.copyfile(cached, partial)
    os.replace(partial, dest)
    return dest


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
