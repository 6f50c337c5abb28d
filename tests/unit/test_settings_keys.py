"""Every settings key the YAML file takes and every ``MODEL_BOSS_*`` variable, written out:
each one set alone to a value other than its default is what the loaded settings carry. A
key renamed or dropped fails its row; a field added without a row fails the coverage check."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from pydantic import BaseModel, SecretStr

from model_boss.settings import (
    END_USER_LIMITS,
    ClientProfile,
    DeclaredGPU,
    EndUserLimits,
    PreloadEntry,
    Settings,
    TracingSettings,
    load_settings,
)


class Key(NamedTuple):
    """One setting: its YAML key, its variable, a value's text (YAML and the environment
    read the same text: JSON for lists and mappings) and what the settings then hold."""

    key: str
    variable: str
    text: str
    expected: Any


KEYS = [
    # the daemon
    Key("host", "MODEL_BOSS_HOST", "0.0.0.0", "0.0.0.0"),
    Key("port", "MODEL_BOSS_PORT", "9000", 9000),
    Key("state_dir", "MODEL_BOSS_STATE_DIR", "/srv/mb/state", Path("/srv/mb/state")),
    Key("shutdown_grace_s", "MODEL_BOSS_SHUTDOWN_GRACE_S", "12.5", 12.5),
    Key("log_level", "MODEL_BOSS_LOG_LEVEL", "DEBUG", "DEBUG"),
    # the catalog
    Key("manifests", "MODEL_BOSS_MANIFESTS", '["/srv/mb/manifests", "/srv/mb/more"]',
        [Path("/srv/mb/manifests"), Path("/srv/mb/more")]),
    Key("tasks_file", "MODEL_BOSS_TASKS_FILE", "/srv/mb/tasks.yaml", Path("/srv/mb/tasks.yaml")),
    Key("models_dir", "MODEL_BOSS_MODELS_DIR", "/srv/mb/models", Path("/srv/mb/models")),
    Key("discover", "MODEL_BOSS_DISCOVER", "false", False),
    Key("default_ctx_size", "MODEL_BOSS_DEFAULT_CTX_SIZE", "8192", 8192),
    Key("watch", "MODEL_BOSS_WATCH", "false", False),
    Key("watch_debounce_ms", "MODEL_BOSS_WATCH_DEBOUNCE_MS", "250", 250),
    Key("hf_endpoint", "MODEL_BOSS_HF_ENDPOINT", "https://hub.example.org",
        "https://hub.example.org"),
    # GPUs and memory
    Key("gpus", "MODEL_BOSS_GPUS", '[{"index": 1, "name": "sim", "vram_mb": 24576}]',
        [{"index": 1, "name": "sim", "vram_mb": 24576}]),
    Key("use_nvml", "MODEL_BOSS_USE_NVML", "false", False),
    Key("reclaim_sleep_s", "MODEL_BOSS_RECLAIM_SLEEP_S", "0.5", 0.5),
    Key("vram_margin_mb", "MODEL_BOSS_VRAM_MARGIN_MB", "1024", 1024),
    Key("lease_ttl_s", "MODEL_BOSS_LEASE_TTL_S", "45", 45.0),
    Key("ram_reserve_mb", "MODEL_BOSS_RAM_RESERVE_MB", "2048", 2048),
    Key("max_offloaded_mb", "MODEL_BOSS_MAX_OFFLOADED_MB", "8192", 8192),
    # the cluster
    Key("redis_url", "MODEL_BOSS_REDIS_URL", "redis://r:6379/0", "redis://r:6379/0"),
    Key("cluster", "MODEL_BOSS_CLUSTER", "true", True),
    Key("cluster_secret", "MODEL_BOSS_CLUSTER_SECRET", "s3cret", "s3cret"),
    Key("advertise_url", "MODEL_BOSS_ADVERTISE_URL", "http://gpu1:8210", "http://gpu1:8210"),
    Key("host_id", "MODEL_BOSS_HOST_ID", "gpu1", "gpu1"),
    Key("cluster_heartbeat_s", "MODEL_BOSS_CLUSTER_HEARTBEAT_S", "1.5", 1.5),
    Key("cluster_member_ttl_s", "MODEL_BOSS_CLUSTER_MEMBER_TTL_S", "9", 9.0),
    Key("cluster_load_lock_s", "MODEL_BOSS_CLUSTER_LOAD_LOCK_S", "20", 20.0),
    Key("cluster_job_claim_s", "MODEL_BOSS_CLUSTER_JOB_CLAIM_S", "60", 60.0),
    # workers
    Key("llama_server_binary", "MODEL_BOSS_LLAMA_SERVER_BINARY", "/opt/llama.cpp/llama-server",
        "/opt/llama.cpp/llama-server"),
    Key("llama_worker", "MODEL_BOSS_LLAMA_WORKER", "binary", "binary"),
    Key("health_timeout_s", "MODEL_BOSS_HEALTH_TIMEOUT_S", "60", 60.0),
    Key("health_interval_s", "MODEL_BOSS_HEALTH_INTERVAL_S", "20", 20.0),
    Key("stop_grace_s", "MODEL_BOSS_STOP_GRACE_S", "3", 3.0),
    Key("request_timeout_s", "MODEL_BOSS_REQUEST_TIMEOUT_S", "120", 120.0),
    Key("stay_warm_s", "MODEL_BOSS_STAY_WARM_S", '{"llm": 42}', {"llm": 42.0}),
    Key("reaper_interval_s", "MODEL_BOSS_REAPER_INTERVAL_S", "2.5", 2.5),
    Key("spare_workers", "MODEL_BOSS_SPARE_WORKERS", "false", False),
    Key("worker_templates", "MODEL_BOSS_WORKER_TEMPLATES", "false", False),
    Key("preload", "MODEL_BOSS_PRELOAD",
        '["qwen", {"model": "sd", "keep_alive_s": -1, "pin": true}]',
        [{"model": "qwen"}, {"model": "sd", "keep_alive_s": -1.0, "pin": True}]),
    # the waiting line
    Key("default_priority", "MODEL_BOSS_DEFAULT_PRIORITY", "3", 3),
    Key("max_queue_wait_s", "MODEL_BOSS_MAX_QUEUE_WAIT_S", "60", 60.0),
    Key("load_comments_after_s", "MODEL_BOSS_LOAD_COMMENTS_AFTER_S", "0", 0.0),
    Key("max_queue_depth", "MODEL_BOSS_MAX_QUEUE_DEPTH", "50", 50),
    Key("max_queued_per_client", "MODEL_BOSS_MAX_QUEUED_PER_CLIENT", "10", 10),
    Key("aging_s", "MODEL_BOSS_AGING_S", "0", 0.0),
    Key("fair_share", "MODEL_BOSS_FAIR_SHARE", "false", False),
    Key("fair_share_turn_s", "MODEL_BOSS_FAIR_SHARE_TURN_S", "4", 4.0),
    Key("request_rate_horizon_s", "MODEL_BOSS_REQUEST_RATE_HORIZON_S", "300", 300.0),
    Key("allow_cloud_fallback", "MODEL_BOSS_ALLOW_CLOUD_FALLBACK", "false", False),
    # replicas
    Key("replica_scale_wait_s", "MODEL_BOSS_REPLICA_SCALE_WAIT_S", "0.5", 0.5),
    Key("replica_load_slack", "MODEL_BOSS_REPLICA_LOAD_SLACK", "4", 4),
    Key("replica_routing", "MODEL_BOSS_REPLICA_ROUTING", "round_robin", "round_robin"),
    # the HTTP edge
    Key("max_body_bytes", "MODEL_BOSS_MAX_BODY_BYTES", "2048", 2048),
    Key("cors_origins", "MODEL_BOSS_CORS_ORIGINS", '["https://app.example.com"]',
        ["https://app.example.com"]),
    Key("allowed_hosts", "MODEL_BOSS_ALLOWED_HOSTS", '["Models.Example.com."]',
        ["models.example.com"]),
    # media
    Key("max_upload_bytes", "MODEL_BOSS_MAX_UPLOAD_BYTES", "4096", 4096),
    Key("max_image_side", "MODEL_BOSS_MAX_IMAGE_SIDE", "1024", 1024),
    Key("videos_mb", "MODEL_BOSS_VIDEOS_MB", "512", 512),
    # keys and limits
    Key("api_key", "MODEL_BOSS_API_KEY", "sk-shared", "sk-shared"),
    Key("api_keys", "MODEL_BOSS_API_KEYS", '{"alice": "sk-alice"}', {"alice": "sk-alice"}),
    Key("admin_api_key", "MODEL_BOSS_ADMIN_API_KEY", "sk-admin", "sk-admin"),
    Key("metrics_api_key", "MODEL_BOSS_METRICS_API_KEY", "sk-scrape", "sk-scrape"),
    Key("clients", "MODEL_BOSS_CLIENTS", '{"alice": {"priority": 1, "share": 2}}',
        {"alice": {"priority": 1, "share": 2.0}}),
    # prompt caches
    Key("prompt_cache_mb", "MODEL_BOSS_PROMPT_CACHE_MB", "0", 0),
    Key("prompt_cache_dir", "MODEL_BOSS_PROMPT_CACHE_DIR", "/srv/mb/prompt-cache",
        Path("/srv/mb/prompt-cache")),
    Key("prompt_cache_min_tokens", "MODEL_BOSS_PROMPT_CACHE_MIN_TOKENS", "64", 64),
    Key("prompt_cache_save_s", "MODEL_BOSS_PROMPT_CACHE_SAVE_S", "2.5", 2.5),
    Key("llama_cache_ram_mb", "MODEL_BOSS_LLAMA_CACHE_RAM_MB", "0", 0),
    # records
    Key("request_log", "MODEL_BOSS_REQUEST_LOG", "false", False),
    Key("usage_ledger", "MODEL_BOSS_USAGE_LEDGER", "false", False),
    Key("capture_prompts", "MODEL_BOSS_CAPTURE_PROMPTS", "true", True),
    Key("capture_prompt_chars", "MODEL_BOSS_CAPTURE_PROMPT_CHARS", "80", 80),
    Key("history_step_s", "MODEL_BOSS_HISTORY_STEP_S", "1", 1.0),
    Key("job_result_ttl_s", "MODEL_BOSS_JOB_RESULT_TTL_S", "60", 60.0),
    Key("max_jobs", "MODEL_BOSS_MAX_JOBS", "10", 10),
    # traces: the one nested section (each of its keys below)
    Key("tracing", "MODEL_BOSS_TRACING", '{"endpoint": "http://collector:4318"}',
        {"endpoint": "http://collector:4318"}),
]

# what a row needs beside itself to be valid, given as keyword arguments
NEEDS: dict[str, dict[str, Any]] = {
    "cluster": {"redis_url": "redis://r:6379/0", "cluster_secret": "s3cret"},
}

# a client profile's keys: clients.<name>.<key> in the file, and the nested variable
# MODEL_BOSS_CLIENTS__<NAME>__<KEY> (text, then value)
CLIENT_PROFILE_KEYS = {
    "priority": ("1", 1),
    "max_concurrency": ("2", 2),
    "max_queued": ("5", 5),
    "share": ("2.5", 2.5),
    "default_task": ("chat", "chat"),
    "allowed_models": ('["qwen*"]', ["qwen*"]),
    "endpoints": ('["chat", "embeddings"]', ["chat", "embeddings"]),
    "priority_floor": ("3", 3),
    "requests_per_minute": ("120", 120),
    "tokens_per_minute": ("20000", 20000),
    "tokens_per_day": ("500000", 500000),
    "tokens_per_month": ("9000000", 9000000),
    "images_per_day": ("50", 50),
    "audio_seconds_per_day": ("3600", 3600.0),
    "gpu_seconds_per_day": ("7200", 7200.0),
    "gpu_seconds_per_month": ("150000", 150000.0),
    "end_user_limits": ('{"max_queued": 2, "tokens_per_day": 900}',
                        EndUserLimits(max_queued=2, tokens_per_day=900)),
}

# each end user's limits under a key: clients.<name>.end_user_limits.<key> in the file, and
# MODEL_BOSS_CLIENTS__<NAME>__END_USER_LIMITS__<KEY> (text, then value)
END_USER_LIMIT_KEYS = {
    "max_concurrency": ("2", 2),
    "max_queued": ("3", 3),
    "requests_per_minute": ("30", 30),
    "tokens_per_minute": ("4000", 4000),
    "tokens_per_day": ("90000", 90000),
}

# the tracing section's keys: tracing.<key> in the file, MODEL_BOSS_TRACING__<KEY> (text,
# then value); each the config-file form of an OTEL_* variable (docs/CONFIGURATION.md)
TRACING_KEYS = {
    "enabled": ("true", True),
    "endpoint": ("http://collector:4317", "http://collector:4317"),
    "protocol": ("grpc", "grpc"),
    "headers": ('{"x-team": "a"}', {"x-team": "a"}),
    "timeout_s": ("2.5", 2.5),
    "sampler": ("parentbased_traceidratio", "parentbased_traceidratio"),
    "sampler_arg": ("0.25", 0.25),
    "service_name": ("boss-7", "boss-7"),
    "resource_attributes": ('{"deployment.environment": "lab"}',
                            {"deployment.environment": "lab"}),
    "max_queue_size": ("100", 100),
    "schedule_delay_ms": ("250", 250),
    "trace_url": ("http://jaeger/trace/{trace_id}", "http://jaeger/trace/{trace_id}"),
}

# a preload entry's and a declared GPU's keys, set in the file over a valid entry
PRELOAD_KEYS = {"model": ("sd", "sd"), "keep_alive_s": ("60", 60.0), "pin": ("true", True)}
PRELOAD_ENTRY = {"model": "qwen"}
GPU_KEYS = {"index": ("2", 2), "name": ("sim-24g", "sim-24g"), "vram_mb": ("24576", 24576)}
GPU_ENTRY = {"index": "0", "vram_mb": "1000"}


def plain(value: Any) -> Any:
    """A loaded value as the table writes it: secrets opened, models as their set fields."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, BaseModel):
        return plain(value.model_dump(exclude_defaults=True))
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


@pytest.fixture(autouse=True)
def no_model_boss_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each case sets one variable; none of the runner's own may add to it."""
    for name in list(os.environ):
        if name.upper().startswith("MODEL_BOSS_"):
            monkeypatch.delenv(name)


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "model-boss.yaml"
    path.write_text(text)
    return path


def list_of_one(key: str, entry: dict[str, str]) -> str:
    """``key:`` holding one entry, in block style: each of its keys on a line."""
    return f"{key}:\n  - " + "\n    ".join(f"{name}: {text}" for name, text in entry.items())


def test_the_table_covers_every_setting() -> None:
    assert [row.key for row in KEYS] == list(dict.fromkeys(row.key for row in KEYS))
    assert {row.key for row in KEYS} == set(Settings.model_fields)
    assert len({row.variable for row in KEYS}) == len(KEYS)
    assert set(CLIENT_PROFILE_KEYS) == set(ClientProfile.model_fields)
    assert set(END_USER_LIMIT_KEYS) == set(EndUserLimits.model_fields) == set(END_USER_LIMITS)
    assert set(PRELOAD_KEYS) == set(PreloadEntry.model_fields)
    assert set(GPU_KEYS) == set(DeclaredGPU.model_fields)
    assert set(TRACING_KEYS) == set(TracingSettings.model_fields)


def test_every_value_differs_from_its_default() -> None:
    defaults = load_settings()
    same = [row.key for row in KEYS if plain(getattr(defaults, row.key)) == row.expected]
    assert not same, f"these rows set the default and so prove nothing: {same}"


@pytest.mark.parametrize("row", KEYS, ids=[row.key for row in KEYS])
def test_each_yaml_key_is_read(tmp_path: Path, row: Key) -> None:
    settings = load_settings(config(tmp_path, f"{row.key}: {row.text}\n"),
                             **NEEDS.get(row.key, {}))
    assert plain(getattr(settings, row.key)) == row.expected


@pytest.mark.parametrize("row", KEYS, ids=[row.variable for row in KEYS])
def test_each_variable_is_read(monkeypatch: pytest.MonkeyPatch, row: Key) -> None:
    monkeypatch.setenv(row.variable, row.text)
    settings = load_settings(None, **NEEDS.get(row.key, {}))
    assert plain(getattr(settings, row.key)) == row.expected


def test_model_boss_config_names_the_file(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    monkeypatch.setenv("MODEL_BOSS_CONFIG", str(config(tmp_path, "port: 9001\n")))
    assert load_settings().port == 9001


@pytest.mark.parametrize("key", list(CLIENT_PROFILE_KEYS))
def test_each_client_profile_key_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                         key: str) -> None:
    text, expected = CLIENT_PROFILE_KEYS[key]
    from_file = load_settings(config(tmp_path, f"clients:\n  alice:\n    {key}: {text}\n"))
    monkeypatch.setenv(f"MODEL_BOSS_CLIENTS__ALICE__{key.upper()}", text)
    from_environment = load_settings()
    for settings in (from_file, from_environment):
        assert getattr(settings.clients["alice"], key) == expected


@pytest.mark.parametrize("key", list(END_USER_LIMIT_KEYS))
def test_each_end_user_limit_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                     key: str) -> None:
    text, expected = END_USER_LIMIT_KEYS[key]
    from_file = load_settings(config(
        tmp_path, f"clients:\n  alice:\n    end_user_limits:\n      {key}: {text}\n"))
    monkeypatch.setenv(f"MODEL_BOSS_CLIENTS__ALICE__END_USER_LIMITS__{key.upper()}", text)
    from_environment = load_settings()
    for settings in (from_file, from_environment):
        limits = settings.clients["alice"].end_user_limits
        assert limits is not None and getattr(limits, key) == expected


@pytest.mark.parametrize("key", list(TRACING_KEYS))
def test_each_tracing_key_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                  key: str) -> None:
    text, expected = TRACING_KEYS[key]
    from_file = load_settings(config(tmp_path, f"tracing:\n  {key}: {text}\n"))
    monkeypatch.setenv(f"MODEL_BOSS_TRACING__{key.upper()}", text)
    from_environment = load_settings()
    for settings in (from_file, from_environment):
        assert getattr(settings.tracing, key) == expected


@pytest.mark.parametrize("key", list(PRELOAD_KEYS))
def test_each_preload_key_is_read(tmp_path: Path, key: str) -> None:
    text, expected = PRELOAD_KEYS[key]
    settings = load_settings(config(tmp_path, list_of_one("preload", {**PRELOAD_ENTRY, key: text})))
    assert getattr(settings.preload[0], key) == expected


@pytest.mark.parametrize("key", list(GPU_KEYS))
def test_each_declared_gpu_key_is_read(tmp_path: Path, key: str) -> None:
    text, expected = GPU_KEYS[key]
    settings = load_settings(config(tmp_path, list_of_one("gpus", {**GPU_ENTRY, key: text})))
    assert getattr(settings.gpus[0], key) == expected
