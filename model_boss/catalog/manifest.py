"""ModelManifest: one servable model, read from YAML files in the manifests directory."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ..errors import ConfigError
from ..settings import describe_validation_error


class Category(StrEnum):
    LLM = "llm"
    DIFFUSION = "diffusion"
    VIDEO = "video"  # a diffusers text- or image-to-video pipeline (served as jobs)
    VISION = "vision"
    TTS = "tts"
    STT = "stt"  # speech recognition (transcription, translation)
    EMBEDDING = "embedding"
    RERANK = "rerank"
    REALTIME = "realtime"  # a pipeline of three served models: /v1/realtime (no path, backend)


class BackendKind(StrEnum):
    LLAMA_SERVER = "llama-server"
    DIFFUSERS = "diffusers"
    CLOUD = "cloud"
    COMMAND = "command"
    TRANSFORMERS = "transformers"  # embedders and rerankers (sentence-transformers)


class LlamaWorker(StrEnum):
    """How a ``llama-server`` backend model is run."""

    NATIVE = "native"  # python -m workers.llama: llama.cpp's server through xllamacpp
    BINARY = "binary"  # an external llama-server (settings.llama_server_binary, else PATH)
    LLAMA_CPP_PYTHON = "llama-cpp-python"  # python -m llama_cpp.server (optional extra)


KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
KV_CACHE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32,
                  "q4_1": 20 / 32, "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}


MODEL_ID = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$"


class AdapterSpec(BaseModel):
    """A LoRA adapter of a base model (``adapters:`` on the base's manifest): served as a
    model of its own, ``id``, on the base's loaded worker."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, pattern=MODEL_ID)
    path: str = Field(min_length=1)  # a LoRA GGUF (llama) or safetensors (diffusers)
    scale: float = Field(default=1.0, ge=0, le=2)
    aliases: list[str] = Field(default_factory=list)


class ReplicaRange(BaseModel):
    """How many copies of a model may run (``replicas:`` on a manifest; a number n is
    ``{min: 1, max: n}``): ``min`` start as soon as it is wanted, more up to ``max`` while its
    requests wait and another GPU has room (docs/SCHEDULING.md)."""

    model_config = ConfigDict(extra="forbid")

    min: int = Field(default=1, ge=1, le=64)
    max: int = Field(default=1, ge=1, le=64)

    @model_validator(mode="before")
    @classmethod
    def _a_number_is_a_maximum(cls, value: Any) -> Any:
        return {"max": value} if isinstance(value, int) and not isinstance(value, bool) \
            else value

    @model_validator(mode="after")
    def _ordered(self) -> ReplicaRange:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be at least min ({self.min})")
        return self


class PipelineSpec(BaseModel):
    """A realtime pipeline's models (``pipeline:`` on a ``category: realtime`` manifest), each
    the id or alias of a model the catalog serves: speech to text, the chat model, the voice."""

    model_config = ConfigDict(extra="forbid")

    transcriber: str = Field(min_length=1)
    llm: str = Field(min_length=1)
    voice: str = Field(min_length=1)

    @property
    def members(self) -> tuple[str, str, str]:
        """The three models, as named: the transcriber, the chat model, the voice."""
        return self.transcriber, self.llm, self.voice


class ModelManifest(BaseModel):
    """What model-boss needs to serve one model. Worker arguments come only from here."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, pattern=MODEL_ID)
    aliases: list[str] = Field(default_factory=list)
    category: Category = Category.LLM
    backend: BackendKind = BackendKind.LLAMA_SERVER
    path: str | None = None
    vram_mb: int | None = Field(default=None, gt=0)
    pin: bool = False
    stay_warm_s: float | None = None
    priority: int | None = Field(default=None, ge=0, le=100)
    chat_template: str | None = None
    thinking: bool | None = None
    # llama-server: each field is one server flag (docs/CONFIGURATION.md)
    worker: LlamaWorker | None = None  # None: settings.llama_worker
    # KV cache tokens, shared by the parallel slots; unset: the GGUF's trained context, as far
    # as the GPUs' VRAM holds its KV cache (catalog/context.py, gpu/context_fit.py)
    ctx_size: int = Field(default=2048, ge=64)
    # layers on the GPU (llama.cpp's; a transformers model's repeated blocks, the rest streamed
    # from CPU RAM for each forward): a number, or auto (all; with allow_partial, as many as fit)
    gpu_layers: int | str = "auto"
    allow_partial: bool = False
    min_gpu_layers: int = Field(default=0, ge=0)
    # transformers, layers streamed: the next one's copy overlaps this one's compute (CUDA)
    offload_prefetch: bool = True
    main_gpu: int | None = Field(default=None, ge=0)
    parallel: int | None = Field(default=None, ge=1, le=1024)
    # requests running at once (at most ``parallel``; the rest wait) and waiting (beyond: 429)
    max_concurrency: int | None = Field(default=None, ge=1)
    max_queued: int | None = Field(default=None, ge=0)
    replicas: ReplicaRange = Field(default_factory=ReplicaRange)
    flash_attn: bool | Literal["auto", "on", "off"] = "auto"
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    # llama.cpp's host-RAM prompt cache (--cache-ram, MiB): many conversations on one loaded
    # model keep their prefixes; None: llama.cpp's default, 0: off
    cache_ram_mb: int | None = Field(default=None, ge=0)
    embeddings: bool = False
    pooling: Literal["none", "mean", "cls", "last", "rank"] | None = None  # None: the GGUF's
    reranking: bool = False
    threads: int | None = Field(default=None, ge=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    # diffusers
    dtype: str = "auto"
    offload: str = "none"
    vae_mb_per_512px: float = Field(default=1600.0, gt=0)
    allow_cpu_vae: bool = True
    # an IP-Adapter for reference_images: its weights file, or a folder holding one, with the
    # image encoder in image_encoder/ beside it; unset: an ip_adapter/ folder in the pipeline's
    ip_adapter: str | None = None
    # video pipelines: the longest clip a request may ask for, and the frame rate it gets when
    # it names none
    max_video_seconds: float = Field(default=10.0, gt=0, le=600)
    fps: int = Field(default=16, ge=1, le=60)
    # transformers: concurrent requests' texts batched, up to batch_size items; a batch goes
    # once max_batch_wait_ms passes with no request joining it, at the latest 10 times that
    # after its first (backends/gathering.py)
    batch_size: int = Field(default=32, ge=1, le=4096)
    max_batch_wait_ms: float = Field(default=5.0, ge=0, le=1000)
    # cloud / command
    base_url: str | None = None
    api: Literal["openai", "anthropic"] = "openai"  # the API a cloud remote speaks
    api_key_env: str | None = None
    remote_model: str | None = None
    command: list[str] = Field(default_factory=list)
    health_path: str = "/health"
    mmproj: str | None = None  # llama-server --mmproj: a vision projector GGUF
    # LoRA adapters served on this model's worker, each under an id of its own
    adapters: list[AdapterSpec] = Field(default_factory=list)
    # llama.cpp: a draft model (same vocabulary, smaller) for speculative decoding
    draft: str | None = None
    draft_max: int | None = Field(default=None, ge=1, le=256)
    draft_min: int | None = Field(default=None, ge=0, le=256)
    draft_p_min: float | None = Field(default=None, ge=0, le=1)
    # category: realtime: the three models a conversation runs on (catalog/realtime.py)
    pipeline: PipelineSpec | None = None
    # filled in by the loader, never from YAML
    base: str | None = Field(default=None, exclude=True)  # an adapter's base model id
    source_file: str | None = Field(default=None, exclude=True)
    source: Literal["manifest", "discovered", "pulled"] = Field(default="manifest",
                                                                exclude=True)
    problem: str | None = Field(default=None, exclude=True)  # why it cannot be served
    # where ctx_size came from (catalog/context.py): a manifest's own ctx_size, the GGUF's
    # trained context, or default_ctx_size; and why it is less than trained, when it is
    ctx_from: Literal["manifest", "trained", "default"] | None = Field(default=None,
                                                                       exclude=True)
    ctx_note: str | None = Field(default=None, exclude=True)

    @field_validator("gpu_layers")
    @classmethod
    def _gpu_layers(cls, value: int | str) -> int | str:
        if isinstance(value, str) and value != "auto":
            raise ValueError("must be an integer or 'auto'")
        if isinstance(value, int) and value < -1:
            raise ValueError("must be >= -1 (-1 = all layers)")
        return value

    @field_validator("cache_type_k", "cache_type_v")
    @classmethod
    def _cache_type(cls, value: str) -> str:
        if value not in KV_CACHE_TYPES:
            raise ValueError(f"must be one of {list(KV_CACHE_TYPES)}")
        return value

    @property
    def flash_attention(self) -> str:
        """``flash_attn`` as llama-server's ``on`` / ``off`` / ``auto``."""
        if isinstance(self.flash_attn, bool):
            return "on" if self.flash_attn else "off"
        return self.flash_attn

    @field_validator("offload")
    @classmethod
    def _offload(cls, value: str) -> str:
        allowed = {"none", "model", "sequential", "group", "balanced"}
        if value not in allowed:
            raise ValueError(f"must be one of {sorted(allowed)}")
        return value

    def resolved_path(self, models_dir: Path) -> Path | None:
        """Absolute model path: ``~`` expanded, relative paths under ``models_dir``."""
        if not self.path:
            return None
        path = Path(self.path).expanduser()
        return path if path.is_absolute() else (models_dir / path)

    def resolved_draft(self, models_dir: Path) -> Path:
        """The draft model's file: ``~`` expanded, relative paths under ``models_dir``."""
        path = Path(self.draft or "").expanduser()
        return path if path.is_absolute() else models_dir / path

    @model_validator(mode="after")
    def _companions(self) -> ModelManifest:
        if self.draft and self.backend != BackendKind.LLAMA_SERVER:
            raise ValueError("draft: only llama-server models take a draft model")
        if self.adapters and self.backend not in (BackendKind.LLAMA_SERVER,
                                                  BackendKind.DIFFUSERS):
            raise ValueError("adapters: only llama-server and diffusers models take adapters")
        names = [name for spec in self.adapters for name in (spec.id, *spec.aliases)]
        clash = next((n for n in names if names.count(n) > 1 or n in self.names), None)
        if clash is not None:
            raise ValueError(f"adapters: the name '{clash}' is given twice")
        return self

    @model_validator(mode="after")
    def _pipeline_only_for_realtime(self) -> ModelManifest:
        if (self.category == Category.REALTIME) != (self.pipeline is not None):
            raise ValueError("pipeline: a category: realtime manifest names one, and only it")
        if self.pipeline is not None and (self.path or "backend" in self.model_fields_set):
            raise ValueError("pipeline: a realtime pipeline has no path or backend of its own")
        return self

    @model_validator(mode="after")
    def _concurrency_within_parallel(self) -> ModelManifest:
        if self.max_concurrency is not None and self.max_concurrency > self.concurrency:
            raise ValueError(f"max_concurrency ({self.max_concurrency}) must be at most the "
                             f"parallel slots ({self.concurrency})")
        return self

    @property
    def running_limit(self) -> int:
        """Requests that may run on the slot at once: ``max_concurrency``, else its slots."""
        return self.max_concurrency or self.concurrency

    @property
    def concurrency(self) -> int:
        """Requests one slot takes at once: ``parallel``, else 1 (256 for cloud remotes; a
        transformers embedder or reranker: its ``batch_size``, so concurrent requests reach its
        batcher)."""
        if self.parallel is not None:
            return self.parallel
        if self.backend == BackendKind.TRANSFORMERS:
            return self.batch_size if self.category in (Category.EMBEDDING,
                                                        Category.RERANK) else 1
        return 256 if self.backend == BackendKind.CLOUD else 1

    @property
    def sees_images(self) -> bool:
        """Image content can reach the model: a vision projector (``mmproj``, or ``--mmproj``
        in its args), ``category: vision``, or a worker that decides for itself (cloud,
        command)."""
        if self.backend in (BackendKind.CLOUD, BackendKind.COMMAND):
            return True
        return bool(self.mmproj) or self.category == Category.VISION or "--mmproj" in self.args

    @property
    def names(self) -> list[str]:
        return [self.id, *self.aliases]


INTERNAL_FIELDS = {"source_file", "source", "problem", "ctx_from", "ctx_note", "base"}


def _manifest_files(sources: list[Path]) -> list[Path]:
    files: list[Path] = []
    for source in sources:
        source = source.expanduser()
        if source.is_dir():
            files.extend(sorted(p for p in source.iterdir() if p.suffix in (".yaml", ".yml")))
        elif source.is_file():
            files.append(source)
        else:
            raise ConfigError(f"{source}: manifests: no such file or directory")
    return files


def parse_manifest_text(text: str, source: str = "<string>") -> list[ModelManifest]:
    """Parse one manifest file's text: a mapping, a list, or ``{models: [...]}``."""
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    if data is None:
        return []
    if isinstance(data, dict) and "models" in data and "id" not in data:
        data = data["models"]
    entries = data if isinstance(data, list) else [data]
    manifests = []
    for position, entry in enumerate(entries):
        where = source if len(entries) == 1 else f"{source} [model {position}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(entry).__name__}")
        for key in INTERNAL_FIELDS & entry.keys():
            raise ConfigError(f"{where}: {key}: set by model-boss, not by a manifest")
        try:
            manifest = ModelManifest.model_validate(entry)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(where, exc)) from exc
        manifest.source_file = source
        if "ctx_size" in entry:
            manifest.ctx_from = "manifest"
        manifests.append(manifest)
    return manifests


def load_manifests(sources: list[Path]) -> list[ModelManifest]:
    """Read every manifest file; duplicate ids or aliases stop startup naming both files."""
    manifests: list[ModelManifest] = []
    seen: dict[str, str] = {}
    for file in _manifest_files(sources):
        try:
            text = file.read_text()
        except OSError as exc:
            raise ConfigError(f"{file}: cannot read: {exc.strerror or exc}") from exc
        for manifest in parse_manifest_text(text, str(file)):
            for name in manifest.names:
                if name in seen:
                    raise ConfigError(
                        f"{file}: id/aliases: '{name}' is already defined in {seen[name]}"
                    )
                seen[name] = str(file)
            manifests.append(manifest)
    return manifests
