"""Media kept on disk: PNGs for ``response_format: url`` answers, finished video clips."""

from __future__ import annotations

import re
import uuid
from collections import OrderedDict
from pathlib import Path

from .errors import NotFound


class ImageFiles:
    """PNG files served for ``response_format: url``; the newest ``keep`` are kept."""

    def __init__(self, directory: Path, keep: int = 500) -> None:
        self.directory = directory
        self.keep = keep
        self._names: OrderedDict[str, None] = OrderedDict()

    def save(self, png: bytes) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        name = uuid.uuid4().hex + ".png"
        (self.directory / name).write_bytes(png)
        self._names[name] = None
        while len(self._names) > self.keep:
            old, _ = self._names.popitem(last=False)
            (self.directory / old).unlink(missing_ok=True)
        return name

    def path(self, name: str) -> Path:
        if not re.fullmatch(r"[0-9a-f]{32}\.png", name) or not (self.directory / name).is_file():
            raise NotFound(f"image '{name}' does not exist (or has expired)")
        return self.directory / name


class VideoFiles:
    """Finished clips (``<job id>.mp4``), kept until their total passes ``max_bytes``: the
    oldest go first. Files left by an earlier run count from the start."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._sizes: OrderedDict[str, int] = OrderedDict()
        found = sorted(directory.glob("*.mp4"), key=lambda p: p.stat().st_mtime) \
            if directory.is_dir() else []
        for path in found:
            self._sizes[path.name] = path.stat().st_size
        self._trim()

    def save(self, job_id: str, data: bytes) -> str:
        """Keep ``data`` as the clip of ``job_id``; its file name."""
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"{job_id}.mp4"
        partial = self.directory / f".{name}.partial"
        partial.write_bytes(data)
        partial.replace(self.directory / name)  # never half a clip under its name
        self._sizes.pop(name, None)
        self._sizes[name] = len(data)
        self._trim()
        return name

    def read(self, job_id: str) -> bytes:
        name = f"{job_id}.mp4"
        path = self.directory / name
        if name not in self._sizes or not path.is_file():
            raise NotFound(f"the video of '{job_id}' is no longer kept (videos_mb)",
                           param="video_id")
        return path.read_bytes()

    def remove(self, job_id: str) -> bool:
        name = f"{job_id}.mp4"
        self._sizes.pop(name, None)
        path = self.directory / name
        existed = path.is_file()
        path.unlink(missing_ok=True)
        return existed

    @property
    def total_bytes(self) -> int:
        return sum(self._sizes.values())

    def _trim(self) -> None:
        while self._sizes and self.total_bytes > self.max_bytes:
            old, _ = self._sizes.popitem(last=False)
            (self.directory / old).unlink(missing_ok=True)


def media_stores(state_dir: Path, videos_mb: int) -> tuple[ImageFiles, VideoFiles]:
    """The pictures and clips a coordinator keeps under ``state_dir``."""
    return ImageFiles(state_dir / "images"), VideoFiles(state_dir / "videos",
                                                         videos_mb * 1024 * 1024)
