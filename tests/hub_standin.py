"""A local stand-in for the Hugging Face Hub's file API, for tests that drive the real client.

``HubStandin`` is a real HTTP server (standard library, a background thread, 127.0.0.1 and a
free port) that answers the requests ``huggingface_hub`` makes for ``hf_hub_download``,
``get_hf_file_metadata``, ``HfApi().model_info`` and ``HfApi().list_repo_files``:

- ``HEAD|GET /{org}/{name}/resolve/{rev}/{file}``: the file, with the hub's headers
  (``X-Repo-Commit``, ``ETag`` and ``X-Linked-Etag`` = the quoted sha256, ``X-Linked-Size``,
  ``Content-Length``); ``Range: bytes=N-`` gets 206 with ``Content-Range``.
- ``GET /api/models/{org}/{name}`` and ``.../revision/{rev}``: model info with ``siblings``
  (sizes and LFS sha256 with ``?blobs=true``, as ``files_metadata=True`` asks).
- ``GET /api/models/{org}/{name}/tree/{rev}[/{path}]``: the tree ``list_repo_files`` reads.

Every file is served LFS-style and every repo has one commit, ``COMMIT``; ``rev`` is ``main``
or that sha. Errors carry the hub's ``X-Error-Code`` so the client raises its own classes:
unknown repo -> 404 ``RepoNotFound`` (``RepositoryNotFoundError``), unknown revision -> 404
``RevisionNotFound``, unknown file -> 404 ``EntryNotFound`` (``RemoteEntryNotFoundError``), a
repo under ``require_token`` without ``Authorization: Bearer <token>`` -> 401 ``RepoNotFound``
(a wrong token: 401 "Invalid credentials in Authorization header", a plain ``HfHubHTTPError``).
Repo ids are ``org/name``. There is no CDN redirect and no Xet: files come straight from here.

Faults, for download tests: ``cut_after(filename, n)`` closes the connection after ``n`` body
bytes of the next GET of that file; ``corrupt(filename)`` serves the same number of different
bytes (the advertised sha256 no longer matches). ``requests`` records ``(method, path, range)``.

Setting up the client. ``huggingface_hub.constants`` reads ``HF_ENDPOINT``, ``HF_HOME``,
``HF_HUB_CACHE``, ``HF_HUB_DISABLE_XET`` ... once, at import, so setting them later in the
test process has no effect.

- In the test process, pass everything explicitly: ``hf_hub_download(repo, file,
  endpoint=hub.url, cache_dir=tmp, token=False)``, ``HfApi(endpoint=hub.url, token=False)``,
  ``get_hf_file_metadata(hf_hub_url(repo, file, endpoint=hub.url), token=False)``. ``token=False``
  (or the token itself) keeps a developer's ``HF_TOKEN`` or saved token out of the requests.
- For a subprocess (e.g. the coordinator), put ``hub.hf_env(tmp)`` in its environment, which
  sets ``HF_ENDPOINT``, ``HF_HOME``, ``HF_HUB_CACHE``, ``HF_HUB_DISABLE_XET=1``,
  ``HF_HUB_DISABLE_TELEMETRY=1`` and clears ``HF_TOKEN``/``HF_HUB_OFFLINE``::

      env = {**os.environ, **hub.hf_env(tmp_path)}
      subprocess.run([...], env=env)
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import sys
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

COMMIT = "5e1f7a2c9d3b4e6f8a0c1d2e3f4a5b6c7d8e9f01"  # the one fake commit of every repo
POINTER_SIZE = 134  # size of a git-lfs pointer file, as the hub reports it
_INVERT = bytes(range(255, -1, -1))  # bytes.translate table of corrupt(): b -> 255 - b
_CHUNK = 1 << 16

_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_API = re.compile(
    r"^/api/models/(?P<repo>[^/]+/[^/]+)"
    r"(?:/revision/(?P<rev>[^/]+)|/tree/(?P<tree>[^/]+)(?:/(?P<path>.*))?)?$"
)
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class Seen(NamedTuple):
    """One request the stand-in received: path without the query, unquoted."""

    method: str
    path: str
    range: str | None


@dataclass(frozen=True)
class _File:
    name: str
    data: bytes | Path
    size: int
    sha256: str
    git_sha1: str

    @classmethod
    def of(cls, name: str, data: bytes | Path) -> _File:
        size = len(data) if isinstance(data, bytes) else data.stat().st_size
        sha256, sha1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
        for chunk in _chunks(data, 0, size):
            sha256.update(chunk)
            sha1.update(chunk)
        return cls(name, data, size, sha256.hexdigest(), sha1.hexdigest())

    def lfs(self) -> dict:
        return {"size": self.size, "pointerSize": POINTER_SIZE}


def _chunks(data: bytes | Path, start: int, end: int) -> Iterator[bytes]:
    """Bytes ``[start, end)`` of ``data``, a file read piece by piece."""
    if isinstance(data, bytes):
        view = memoryview(data)
        for pos in range(start, end, _CHUNK):
            yield bytes(view[pos:min(pos + _CHUNK, end)])
        return
    with data.open("rb") as f:
        f.seek(start)
        while start < end:
            chunk = f.read(min(_CHUNK, end - start))
            if not chunk:
                return
            start += len(chunk)
            yield chunk


def _byte_range(header: str, size: int) -> tuple[int, int] | None:
    """``(start, end)``, end exclusive, of a single-range ``Range`` header; None: unsatisfiable."""
    match = _RANGE.match(header.strip())
    if match is None or match.groups() == ("", ""):
        return None
    first, last = match.groups()
    if first == "":  # bytes=-K: the last K bytes
        start, end = max(size - int(last), 0), size
    else:
        start, end = int(first), size if last == "" else min(int(last) + 1, size)
    return (start, end) if start < end else None


class _HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, commit: bool = False):
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


class HubStandin:
    """A fake Hugging Face Hub on ``self.url``; start/stop, or use as a context manager."""

    commit = COMMIT

    def __init__(self) -> None:
        self.requests: list[Seen] = []
        self._repos: dict[str, dict[str, _File]] = {}
        self._tokens: dict[str, str] = {}
        self._cuts: dict[str, deque[int]] = {}
        self._corrupt: set[str] = set()
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # -- content ---------------------------------------------------------------------------

    def add_file(self, repo_id: str, filename: str, data: bytes | Path) -> str:
        """Put ``data`` (bytes, or a file served from disk) at ``filename``; returns its sha256."""
        file = _File.of(filename, data)
        with self._lock:
            self._repos.setdefault(repo_id, {})[filename] = file
        return file.sha256

    def add_repo(self, repo_id: str) -> None:
        """An empty repo (``add_file`` creates repos as it goes)."""
        with self._lock:
            self._repos.setdefault(repo_id, {})

    def require_token(self, repo_id: str, token: str) -> None:
        """Make ``repo_id`` private: every request needs ``Authorization: Bearer <token>``."""
        with self._lock:
            self._repos.setdefault(repo_id, {})
            self._tokens[repo_id] = token

    # -- faults ----------------------------------------------------------------------------

    def cut_after(self, filename: str, n_bytes: int, times: int = 1) -> None:
        """Close the connection after ``n_bytes`` of the body of the next ``times`` GETs.

        Cuts queue up: ``cut_after(f, 1000); cut_after(f, 0, times=5)`` cuts the next GET of
        ``f`` after 1000 bytes, then the five after it before any body byte.
        """
        with self._lock:
            self._cuts.setdefault(filename, deque()).extend([n_bytes] * times)

    def corrupt(self, filename: str, on: bool = True) -> None:
        """Serve other bytes (same size) than the advertised sha256 for ``filename``."""
        with self._lock:
            (self._corrupt.add if on else self._corrupt.discard)(filename)

    def clear_faults(self) -> None:
        with self._lock:
            self._cuts.clear()
            self._corrupt.clear()

    def _take_faults(self, filename: str) -> tuple[int | None, bool]:
        with self._lock:
            cuts = self._cuts.get(filename)
            return (cuts.popleft() if cuts else None), filename in self._corrupt

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> HubStandin:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.hub = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
            name="hub-standin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.close_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> HubStandin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def hf_env(self, home: Path) -> dict[str, str]:
        """Environment for a process whose ``huggingface_hub`` should use this stand-in.

        ``HF_TOKEN`` and ``HF_HUB_OFFLINE`` are set empty, which the client reads as unset.
        """
        return {
            "HF_ENDPOINT": self.url,
            "HF_HOME": str(home),
            "HF_HUB_CACHE": str(Path(home) / "hub"),
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_TOKEN": "",
            "HF_HUB_OFFLINE": "",
        }

    # -- answers ---------------------------------------------------------------------------

    def _repo(self, repo_id: str, rev: str, authorization: str | None) -> dict[str, _File]:
        """The files of ``repo_id`` at ``rev``, or the hub's error for it."""
        with self._lock:
            files = self._repos.get(repo_id)
            token = self._tokens.get(repo_id)
        if files is None:
            raise _HubError(404, "RepoNotFound", "Repository not found")
        if token is not None and authorization != f"Bearer {token}":
            if authorization is None:
                raise _HubError(401, "RepoNotFound", "Invalid username or password.")
            raise _HubError(401, None, "Invalid credentials in Authorization header")
        if rev not in ("main", COMMIT):
            raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return dict(files)

    def _model_info(self, repo_id: str, files: dict[str, _File], blobs: bool) -> dict:
        siblings = []
        for file in sorted(files.values(), key=lambda f: f.name):
            sibling: dict = {"rfilename": file.name}
            if blobs:
                sibling.update(size=file.size, blobId=file.git_sha1,
                               lfs={"sha256": file.sha256, **file.lfs()})
            siblings.append(sibling)
        return {"_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24], "id": repo_id,
                "modelId": repo_id, "sha": COMMIT, "private": repo_id in self._tokens,
                "gated": False, "disabled": False, "lastModified": "2024-01-01T00:00:00.000Z",
                "tags": [], "siblings": siblings}

    @staticmethod
    def _tree(files: dict[str, _File], prefix: str, recursive: bool) -> list[dict]:
        prefix = prefix.strip("/")
        base = f"{prefix}/" if prefix else ""
        under = [f for f in files.values() if f.name.startswith(base)]
        if prefix and not under:
            raise _HubError(404, "EntryNotFound", f"{prefix} does not exist", commit=True)
        folders: set[str] = set()
        entries = []
        for file in sorted(under, key=lambda f: f.name):
            parts = file.name[len(base):].split("/")
            if recursive:
                folders.update(base + "/".join(parts[:i]) for i in range(1, len(parts)))
            elif len(parts) > 1:
                folders.add(base + parts[0])
                continue
            entries.append({"type": "file", "oid": file.git_sha1, "size": file.size,
                            "path": file.name, "lfs": {"oid": file.sha256, **file.lfs()}})
        dirs = [{"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0,
                 "path": d} for d in sorted(folders)]
        return dirs + entries


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    hub: HubStandin

    def __init__(self, *args, **kwargs) -> None:
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def close_connections(self) -> None:
        """Wake the threads waiting on kept-alive connections so they end now."""
        with self.connections_lock:
            for sock in self.connections:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that went away
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _answer(self, head: bool) -> None:
        hub = self.server.hub
        url = urlsplit(self.path)
        with hub._lock:
            hub.requests.append(Seen(self.command, unquote(url.path), self.headers.get("Range")))
        auth = self.headers.get("Authorization")
        try:
            if match := _RESOLVE.match(url.path):
                repo, rev, name = (unquote(match[g]) for g in ("repo", "rev", "path"))
                file = hub._repo(repo, rev, auth).get(name)
                if file is None:
                    raise _HubError(404, "EntryNotFound", f"{name} does not exist", commit=True)
                self._send_file(file, head)
            elif match := _API.match(url.path):
                repo = unquote(match["repo"])
                query = parse_qs(url.query)
                if match["tree"] is not None:
                    files = hub._repo(repo, unquote(match["tree"]), auth)
                    recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
                    body = hub._tree(files, unquote(match["path"] or ""), recursive)
                else:
                    files = hub._repo(repo, unquote(match["rev"] or "main"), auth)
                    blobs = query.get("blobs", ["false"])[0].lower() in ("true", "1")
                    body = hub._model_info(repo, files, blobs)
                self._send(200, json.dumps(body).encode(), head,
                           [("Content-Type", "application/json")])
            else:
                raise _HubError(404, None, "Not Found")
        except _HubError as e:
            headers = [("Content-Type", "application/json"), ("X-Error-Message", e.message)]
            if e.code:
                headers.append(("X-Error-Code", e.code))
            if e.commit:
                headers.append(("X-Repo-Commit", COMMIT))
            self._send(e.status, json.dumps({"error": e.message}).encode(), head, headers)

    def _send(self, status: int, body: bytes, head: bool, headers: list[tuple[str, str]]) -> None:
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _send_file(self, file: _File, head: bool) -> None:
        start, end, status = 0, file.size, 200
        headers = [("Content-Type", "application/octet-stream"), ("Accept-Ranges", "bytes"),
                   ("ETag", f'"{file.sha256}"'), ("X-Linked-Etag", f'"{file.sha256}"'),
                   ("X-Linked-Size", str(file.size)), ("X-Repo-Commit", COMMIT)]
        if (header := self.headers.get("Range")) is not None:
            byte_range = _byte_range(header, file.size)
            if byte_range is None:
                self._send(416, b"", head, [("Content-Range", f"bytes */{file.size}")])
                return
            (start, end), status = byte_range, 206
            headers.append(("Content-Range", f"bytes {start}-{end - 1}/{file.size}"))
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if head:
            return
        cut, corrupt = self.server.hub._take_faults(file.name)
        stop = end if cut is None else min(end, start + cut)
        for chunk in _chunks(file.data, start, stop):
            self.wfile.write(chunk.translate(_INVERT) if corrupt else chunk)
        if stop < end:  # the cut: the client sees the peer close mid-body
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
