"""Prompt caches kept across swaps, and llama.cpp's own host-RAM prompt cache."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from .core import ServerSettings


class PromptCacheSettings(ServerSettings):
    """Where llama.cpp models' prompt caches are saved and how much of them is kept; its
    folder defaults to one under the daemon's ``state_dir``."""

    # llama.cpp models' prompt caches saved when they are evicted or unloaded and restored at
    # their next load: at most this much on disk (0: off), least recently used out first
    prompt_cache_mb: int = Field(default=4096, ge=0)
    prompt_cache_dir: Path | None = None  # default: <state_dir>/prompt-cache
    prompt_cache_min_tokens: int = Field(default=512, ge=1)  # a shorter prompt is not kept
    prompt_cache_save_s: float = Field(default=10.0, gt=0)  # a swap waits at most this long
    # llama.cpp's own host-RAM prompt cache for every llama model whose manifest sets no
    # cache_ram_mb (--cache-ram, MiB; 0: off; None: llama.cpp's default)
    llama_cache_ram_mb: int | None = Field(default=None, ge=0)

    @property
    def prompt_cache_path(self) -> Path:
        return (self.prompt_cache_dir or self.state_dir / "prompt-cache").expanduser()
