"""ImageFiles: PNGs kept on disk for ``response_format: url`` answers."""

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
