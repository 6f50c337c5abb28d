"""Worker processes: which kind runs a llama model, their health, stop, stay-warm, spares,
templates, and the models loaded at startup."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_STAY_WARM_S = {"diffusion": 900.0, "video": 900.0, "llm": 300.0, "vision": 60.0,
                       "tts": 300.0, "stt": 300.0, "embedding": 300.0, "rerank": 300.0}


class PreloadEntry(BaseModel):
    """A model loaded in the background at startup. ``keep_alive_s``: how long it stays
    after its last request (None: its stay-warm; -1: until evicted for room); ``pin``: never
    evicted, as ``POST /api/v1/models/{id}/pin``."""

    model_config = ConfigDict(extra="forbid")

    model: str
    keep_alive_s: float | None = None
    pin: bool = False


class WorkerSettings(BaseModel):
    """How workers are started, checked, kept warm and stopped."""

    llama_server_binary: str | None = None
    # manifests without ``worker``: native | binary | llama-cpp-python; unset → binary when
    # llama_server_binary is set, else native
    llama_worker: Literal["native", "binary", "llama-cpp-python"] | None = None
    health_timeout_s: float = Field(default=120.0, gt=0)
    health_interval_s: float = Field(default=10.0, gt=0)  # idle READY workers are checked
    stop_grace_s: float = Field(default=10.0, ge=0)
    request_timeout_s: float = Field(default=600.0, gt=0)
    stay_warm_s: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_STAY_WARM_S))
    reaper_interval_s: float = Field(default=5.0, gt=0)
    spare_workers: bool = True  # a pre-started diffusers worker waits for the next cold load
    # diffusers and transformers workers forked from a process that did their imports once
    # (backends/processes/templates.py); off: each starts a fresh interpreter
    worker_templates: bool = True
    # ids, or entries that stay: {model, keep_alive_s: -1 | seconds, pin: true}
    preload: list[PreloadEntry] = Field(default_factory=list)

    @field_validator("preload", mode="before")
    @classmethod
    def _preload_ids(cls, value: Any) -> Any:
        return [{"model": v} if isinstance(v, str) else v for v in value] \
            if isinstance(value, list) else value

    def stay_warm_for(self, category: str) -> float:
        return self.stay_warm_s.get(category, DEFAULT_STAY_WARM_S.get(category, 300.0))
