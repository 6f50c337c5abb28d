"""What is served: manifests, task ladders, the models folder and how changes are seen."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, Field, field_validator
from pydantic_settings import NoDecode


class CatalogSettings(BaseModel):
    """Where the catalog comes from and how it is reloaded (docs/MODELS.md)."""

    manifests: Annotated[list[Path], NoDecode] = Field(
        default_factory=lambda: [Path("manifests")])
    tasks_file: Path | None = Path("tasks.yaml")
    models_dir: Path = Path("~/.cache/model-boss/models")
    # every model file under models_dir is served without a manifest (docs/MODELS.md)
    discover: bool = True
    # a llama.cpp model's context when its GGUF names no trained one (and no manifest ctx_size)
    default_ctx_size: int = Field(default=4096, ge=64)
    # manifests, tasks_file and models_dir are watched; a change reloads the catalog
    watch: bool = True
    watch_debounce_ms: int = Field(default=800, ge=50)
    hf_endpoint: str = ""  # the hub model-boss pull uses; default: HF_ENDPOINT, else the hub

    @field_validator("manifests", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().startswith("["):
            return yaml.safe_load(value)  # JSON list from the environment
        if isinstance(value, (str, Path)):
            return [part for part in str(value).split(os.pathsep) if part]
        return value

    @property
    def models_path(self) -> Path:
        return self.models_dir.expanduser()
