"""The daemon itself: where it listens, where it keeps its state, how it stops and logs."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field


class ServerSettings(BaseModel):
    """Address, state folder, stop grace and log level of the daemon."""

    host: str = "127.0.0.1"
    port: int = Field(default=8210, ge=1, le=65535)
    state_dir: Path = Path("~/.local/state/model-boss")
    # a stop (SIGTERM, SIGINT) lets running requests finish this long (workers: stop_grace_s)
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    log_level: str = "INFO"

    @property
    def state_path(self) -> Path:
        return self.state_dir.expanduser()
