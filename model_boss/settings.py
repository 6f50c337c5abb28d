"""Daemon settings: ``MODEL_BOSS_*`` environment variables over an optional YAML file.

Precedence, highest first: keyword arguments, environment, the YAML file, defaults.
Relative paths in the YAML file are taken relative to the file's own directory.
"""

from __future__ import annotations

import contextvars
import os
import re
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from .errors import ConfigError

_CONFIG_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "model_boss_config_file", default=None
)

DEFAULT_STAY_WARM_S = {"diffusion": 900.0, "video": 900.0, "llm": 300.0, "vision": 60.0,
                       "tts": 300.0, "stt": 300.0, "embedding": 300.0, "rerank": 300.0}


# the default CORS origins: pages served from this machine, on any port (as Ollama allows)
LOOPBACK_ORIGINS = tuple(f"{scheme}://{host}:*" for scheme in ("http", "https")
                         for host in ("localhost", "127.0.0.1", "[::1]"))
_ORIGIN = re.compile(r"^[a-z][a-z0-9+.-]*://[^/\s:]+(\]?)(:(\d{1,5}|\*))?$|"
                     r"^[a-z][a-z0-9+.-]*://\[[0-9a-f:]+\](:(\d{1,5}|\*))?$", re.IGNORECASE)
# an allowed_hosts entry: a DNS name, or "*." and one (any of its subdomains)
_LABEL = r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?"
_HOST_NAME = re.compile(rf"^(\*\.)?{_LABEL}(\.{_LABEL})*\.?$", re.IGNORECASE)


class DeclaredGPU(BaseModel):
    """A GPU declared in settings, used when NVML finds none (or to simulate a box)."""

    index: int = Field(ge=0)
    name: str = "declared"
    vram_mb: int = Field(gt=0)


# what a key may be scoped to, by the routes' kind (docs/SECURITY.md)
EndpointKind = Literal["chat", "embeddings", "images", "video", "audio", "rerank"]
ENDPOINT_KINDS: tuple[str, ...] = ("chat", "embeddings", "images", "video", "audio", "rerank")

Count = Annotated[int, Field(ge=0)]
Seconds = Annotated[float, Field(ge=0)]
# The limits a client or key profile may set, each with its type, declared once: the key API,
# the keys command line, the door's admission, the cluster's counters and the policy read
# these. Rates count a sliding minute; quotas a UTC day or month.
RATES: dict[str, type] = {"requests_per_minute": int, "tokens_per_minute": int}
QUOTAS: dict[str, type] = {
    "tokens_per_day": int, "tokens_per_month": int, "images_per_day": int,
    "audio_seconds_per_day": float, "gpu_seconds_per_day": float,
    "gpu_seconds_per_month": float}
LIMITS: dict[str, type] = {"priority_floor": int, "priority": int, "max_concurrency": int,
                           "max_queued": int, "share": float, **RATES, **QUOTAS}


class ClientProfile(BaseModel):
    """Defaults, scope and limits for one client: a key's name (``api_keys``, a managed key)
    or, with no keys configured, a client id (``x_client_id`` / ``X-Client-Id``).

    ``allowed_models`` are names or globs (``qwen*``); ``endpoints`` the kinds of route it
    may call; ``priority_floor`` the most important priority it may ask for. Rates count a
    sliding minute; quotas a UTC day or month (docs/SECURITY.md)."""

    model_config = ConfigDict(extra="forbid")

    priority: int | None = Field(default=None, ge=0, le=100)
    max_concurrency: int | None = Field(default=None, ge=1)
    max_queued: int | None = Field(default=None, ge=0)  # waiting at once; beyond: 429
    share: float | None = Field(default=None, gt=0)  # fair-share weight (else the task's)
    default_task: str | None = None
    allowed_models: list[Annotated[str, Field(min_length=1)]] | None = None
    endpoints: list[EndpointKind] | None = None
    priority_floor: int | None = Field(default=None, ge=0, le=100)
    requests_per_minute: Count | None = None
    tokens_per_minute: Count | None = None
    tokens_per_day: Count | None = None
    tokens_per_month: Count | None = None
    images_per_day: Count | None = None
    audio_seconds_per_day: Seconds | None = None
    gpu_seconds_per_day: Seconds | None = None
    gpu_seconds_per_month: Seconds | None = None


class PreloadEntry(BaseModel):
    """A model loaded in the background at startup. ``keep_alive_s``: how long it stays
    after its last request (None: its stay-warm; -1: until evicted for room); ``pin``: never
    evicted, as ``POST /api/v1/models/{id}/pin``."""

    model_config = ConfigDict(extra="forbid")

    model: str
    keep_alive_s: float | None = None
    pin: bool = False


class Settings(BaseSettings):
    """Everything the daemon reads at start; see docs/CONFIGURATION.md."""

    model_config = SettingsConfigDict(
        env_prefix="MODEL_BOSS_", extra="forbid", env_nested_delimiter="__"
    )

    host: str = "127.0.0.1"
    port: int = Field(default=8210, ge=1, le=65535)
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
    state_dir: Path = Path("~/.local/state/model-boss")
    gpus: list[DeclaredGPU] = Field(default_factory=list)
    use_nvml: bool = True
    redis_url: str = ""
    # several coordinators sharing one Redis (docs/CLUSTER.md): on with ``cluster: true``
    cluster: bool = False
    cluster_secret: SecretStr | None = None  # MODEL_BOSS_CLUSTER_SECRET; members' forwards
    advertise_url: str = ""  # how other members reach this one; default http://{host}:{port}
    host_id: str = ""  # this member's name in the cluster; default {hostname}:{port}
    cluster_heartbeat_s: float = Field(default=2.0, gt=0)
    cluster_member_ttl_s: float = Field(default=6.0, gt=0)  # a member is out after this
    cluster_load_lock_s: float = Field(default=10.0, gt=0)  # one load per model at a time
    cluster_job_claim_s: float = Field(default=30.0, gt=0)  # a dead member's jobs are taken
    reclaim_sleep_s: float = Field(default=2.0, ge=0)
    vram_margin_mb: int = Field(default=512, ge=0)
    lease_ttl_s: float = Field(default=30.0, gt=0)
    health_timeout_s: float = Field(default=120.0, gt=0)
    stop_grace_s: float = Field(default=10.0, ge=0)
    # a stop (SIGTERM, SIGINT) lets running requests finish this long (workers: stop_grace_s)
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    stay_warm_s: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_STAY_WARM_S))
    reaper_interval_s: float = Field(default=5.0, gt=0)
    health_interval_s: float = Field(default=10.0, gt=0)  # idle READY workers are checked
    default_priority: int = Field(default=5, ge=0, le=100)
    max_queue_wait_s: float = Field(default=300.0, gt=0)
    # a stream that has waited this long on its model's load starts with SSE comment lines
    load_comments_after_s: float = Field(default=1.0, ge=0)
    max_queue_depth: int = Field(default=1000, ge=1)
    max_queued_per_client: int = Field(default=200, ge=1)
    aging_s: float = Field(default=2.0, ge=0)  # waiting this long = one priority level
    fair_share: bool = True
    fair_share_turn_s: float = Field(default=2.0, gt=0)  # due-time cost of one turn
    request_rate_horizon_s: float = Field(default=120.0, gt=0)
    # replicas (docs/SCHEDULING.md): a model whose first waiter waited this long gets one more
    # where a GPU has room; a request goes to the replica holding its prompt's prefix unless
    # that one runs more than replica_load_slack requests beyond the least loaded one
    replica_scale_wait_s: float = Field(default=2.0, ge=0)
    replica_load_slack: int = Field(default=2, ge=0)
    replica_routing: Literal["cache", "least_loaded", "round_robin"] = "cache"
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # an upload: audio to transcribe (OpenAI's limit: 25 MB), pictures to edit, a video's
    # reference; a picture's sides at most max_image_side; finished videos kept in videos_mb
    max_upload_bytes: int = Field(default=25 * 1024 * 1024, ge=1024)
    max_image_side: int = Field(default=4096, ge=64, le=16384)
    videos_mb: int = Field(default=2048, ge=1)
    request_timeout_s: float = Field(default=600.0, gt=0)
    llama_server_binary: str | None = None
    # manifests without ``worker``: native | binary | llama-cpp-python; unset → binary when
    # llama_server_binary is set, else native
    llama_worker: Literal["native", "binary", "llama-cpp-python"] | None = None
    api_key: str | None = None
    # named user keys: client name → key; a request with one is that client (docs/CONFIGURATION.md)
    api_keys: dict[Annotated[str, Field(min_length=1, max_length=200)],
                   Annotated[SecretStr, Field(min_length=1)]] = Field(default_factory=dict)
    admin_api_key: str | None = None
    # browser origins that may call the API (CORS): "scheme://host", ":*" for any port, or "*"
    cors_origins: list[str] = Field(default_factory=lambda: list(LOOPBACK_ORIGINS))
    # names a request's Host may carry besides this machine's own and any IP address
    # (docs/SECURITY.md): "name", "*.example.org" (its subdomains) or "*" (any)
    allowed_hosts: list[str] = Field(default_factory=list)
    allow_cloud_fallback: bool = True
    clients: dict[str, ClientProfile] = Field(default_factory=dict)
    # ids, or entries that stay: {model, keep_alive_s: -1 | seconds, pin: true}
    preload: list[PreloadEntry] = Field(default_factory=list)
    ram_reserve_mb: int = Field(default=4096, ge=0)
    max_offloaded_mb: int | None = Field(default=None, ge=0)
    # llama.cpp models' prompt caches saved when they are evicted or unloaded and restored at
    # their next load: at most this much on disk (0: off), least recently used out first
    prompt_cache_mb: int = Field(default=4096, ge=0)
    prompt_cache_dir: Path | None = None  # default: <state_dir>/prompt-cache
    prompt_cache_min_tokens: int = Field(default=512, ge=1)  # a shorter prompt is not kept
    prompt_cache_save_s: float = Field(default=10.0, gt=0)  # a swap waits at most this long
    # llama.cpp's own host-RAM prompt cache for every llama model whose manifest sets no
    # cache_ram_mb (--cache-ram, MiB; 0: off; None: llama.cpp's default)
    llama_cache_ram_mb: int | None = Field(default=None, ge=0)
    spare_workers: bool = True  # a pre-started diffusers worker waits for the next cold load
    # diffusers and transformers workers forked from a process that did their imports once
    # (backends/processes/templates.py); off: each starts a fresh interpreter
    worker_templates: bool = True
    job_result_ttl_s: float = Field(default=3600.0, gt=0)
    max_jobs: int = Field(default=1000, ge=1)
    request_log: bool = True
    # every finished request's usage in state_dir/usage.sqlite3 (GET /api/v1/usage); off:
    # kept in memory only, for quotas and reports until the daemon stops
    usage_ledger: bool = True
    # prompt text in the last requests' rows (/api/v1/requests, admin): off unless turned on,
    # and cut to this many characters
    capture_prompts: bool = False
    capture_prompt_chars: int = Field(default=500, ge=1, le=20000)
    history_step_s: float = Field(default=5.0, ge=1, le=600)  # dashboard timeline step
    log_level: str = "INFO"

    @field_validator("preload", mode="before")
    @classmethod
    def _preload_ids(cls, value: Any) -> Any:
        return [{"model": v} if isinstance(v, str) else v for v in value] \
            if isinstance(value, list) else value

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        for origin in value:
            if origin != "*" and not _ORIGIN.match(origin):
                raise ValueError(f"{origin!r} is not an origin: 'scheme://host', "
                                 "'scheme://host:port', 'scheme://host:*' (any port) or '*'")
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if name != "*" and not _HOST_NAME.match(name):
                raise ValueError(f"{name!r} is not a host name: 'name', '*.example.org' (its "
                                 "subdomains) or '*' (any); no scheme, no port (IP addresses "
                                 "are always allowed)")
        return [name.lower().rstrip(".") for name in value]

    @field_validator("manifests", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().startswith("["):
            return yaml.safe_load(value)  # JSON list from the environment
        if isinstance(value, (str, Path)):
            return [part for part in str(value).split(os.pathsep) if part]
        return value

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   **_others: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _YamlFileSource(settings_cls))

    @model_validator(mode="after")
    def _cluster_needs_redis(self) -> Settings:
        if self.cluster:
            if not self.redis_url:
                raise ValueError("cluster: true needs redis_url (the Redis every member shares)")
            if self.cluster_secret is None or not self.cluster_secret.get_secret_value():
                raise ValueError("cluster: true needs cluster_secret (or the "
                                 "MODEL_BOSS_CLUSTER_SECRET environment variable)")
            if self.cluster_member_ttl_s <= self.cluster_heartbeat_s:
                raise ValueError("cluster_member_ttl_s must be longer than "
                                 "cluster_heartbeat_s")
        return self

    @field_validator("api_keys")
    @classmethod
    def _client_names_travel_as_headers(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for client in value:
            if not all("!" <= ch <= "~" for ch in client):
                raise ValueError(f"client name {client!r}: visible ASCII only, no spaces (it "
                                 "is the request's X-Client-Id)")
        return value

    @model_validator(mode="after")
    def _keys_are_distinct(self) -> Settings:
        seen: dict[str, str] = {}
        if self.api_key:
            seen[self.api_key] = "api_key"
        if self.admin_api_key:
            seen[self.admin_api_key] = "admin_api_key"
        for client, secret in self.api_keys.items():
            key = secret.get_secret_value()
            if key in seen:
                raise ValueError(f"api_keys.{client}: the same key as {seen[key]}; "
                                 "each client needs its own")
            seen[key] = f"api_keys.{client}"
        return self

    @property
    def user_keys_set(self) -> bool:
        """Whether ``/v1/*`` needs a key (``api_key`` or any of ``api_keys``)."""
        return bool(self.api_key or self.api_keys)

    @property
    def member_id(self) -> str:
        """This coordinator's host id in a cluster."""
        return self.host_id or f"{socket.gethostname()}:{self.port}"

    @property
    def member_url(self) -> str:
        """The URL other members forward to."""
        return (self.advertise_url or f"http://{self.host}:{self.port}").rstrip("/")

    def stay_warm_for(self, category: str) -> float:
        return self.stay_warm_s.get(category, DEFAULT_STAY_WARM_S.get(category, 300.0))
    @property
    def state_path(self) -> Path:
        return self.state_dir.expanduser()

    @property
    def prompt_cache_path(self) -> Path:
        return (self.prompt_cache_dir or self.state_dir / "prompt-cache").expanduser()

    @property
    def models_path(self) -> Path:
        return self.models_dir.expanduser()


class _YamlFileSource(PydanticBaseSettingsSource):
    """Reads the YAML file named by :func:`load_settings`; resolves its relative paths."""

    def get_field_value(self, field: Any, name: str) -> tuple[Any, str, bool]:  # unused
        return None, name, False

    def __call__(self) -> dict[str, Any]:
        path = _CONFIG_FILE.get()
        if path is None:
            return {}
        data = read_yaml_mapping(path)
        base = path.parent
        for key in ("tasks_file", "models_dir", "state_dir", "prompt_cache_dir"):
            if isinstance(data.get(key), str):
                data[key] = _relative_to(base, data[key])
        manifests = data.get("manifests")
        manifests = [manifests] if isinstance(manifests, str) else manifests
        if isinstance(manifests, list):
            data["manifests"] = [_relative_to(base, m) if isinstance(m, str) else m
                                 for m in manifests]
        return data


def _relative_to(base: Path, value: str) -> str:
    expanded = Path(value).expanduser()
    return str(expanded if expanded.is_absolute() else base / expanded)


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """Parse a YAML file that must hold a mapping; errors name the file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def describe_validation_error(source: str, exc: ValidationError) -> str:
    """One line per problem: ``file: field.path: message``."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(part) for part in err["loc"]) or "(top level)"
        lines.append(f"{source}: {loc}: {err['msg']}")
    return "; ".join(lines)


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build Settings from env + the YAML file (argument, else ``MODEL_BOSS_CONFIG``)."""
    raw = config_file or os.environ.get("MODEL_BOSS_CONFIG") or None
    path = Path(raw).expanduser() if raw else None
    if path is not None and not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    token = _CONFIG_FILE.set(path)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        source = str(path) if path else "settings (MODEL_BOSS_* environment)"
        raise ConfigError(describe_validation_error(source, exc)) from exc
    except SettingsError as exc:  # a MODEL_BOSS_* variable that cannot be parsed
        raise ConfigError(f"MODEL_BOSS_* environment: {exc}") from exc
    finally:
        _CONFIG_FILE.reset(token)
