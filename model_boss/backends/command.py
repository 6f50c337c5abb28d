"""CommandBackend: any command that serves an OpenAI-compatible API on ``{port}``."""

from __future__ import annotations

from ..errors import LoadFailed
from ..gpu.placement import Placement
from .base import HttpWorkerBackend


class CommandBackend(HttpWorkerBackend):
    """Runs ``manifest.command`` with ``{port}``, ``{host}`` and ``{model_path}`` filled in
    (TTS, ASR, vLLM, ...); health is ``manifest.health_path``."""

    @property
    def health_path(self) -> str:  # type: ignore[override]
        return self.manifest.health_path

    def argv(self, port: int, placement: Placement | None) -> list[str]:
        values = {"port": str(port), "host": "127.0.0.1",
                  "model_path": str(self.entry.path or ""),
                  "gpus": placement.cuda_visible_devices if placement else ""}
        try:
            argv = [part.format(**values) for part in self.manifest.command]
        except (KeyError, IndexError, ValueError) as exc:
            raise LoadFailed(f"{self.manifest.source_file}: command: bad placeholder {exc}; "
                             "use {port}, {host}, {model_path}, {gpus}") from exc
        return argv + list(self.manifest.args)
