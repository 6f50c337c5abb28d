"""Traces (OpenTelemetry): the config file's ``tracing:`` section, each field the config-file
form of a standard ``OTEL_*`` variable; the variable, where set, wins (docs/CONFIGURATION.md
"Traces")."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class TracingSettings(BaseModel):
    """Where and how spans are exported; off unless ``enabled`` or an ``endpoint`` is set
    here, or the ``OTEL_*`` variables turn traces on."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool | None = None  # OTEL_TRACES_EXPORTER: otlp (true) or none (false)
    endpoint: str | None = None  # OTEL_EXPORTER_OTLP_ENDPOINT, e.g. http://localhost:4318
    protocol: Literal["http/protobuf", "grpc"] | None = None  # OTEL_EXPORTER_OTLP_PROTOCOL
    headers: dict[str, str] = Field(default_factory=dict)  # OTEL_EXPORTER_OTLP_HEADERS
    timeout_s: float | None = Field(default=None, gt=0)  # OTEL_EXPORTER_OTLP_TIMEOUT
    # OTEL_TRACES_SAMPLER and its argument (the ratio of the *traceidratio samplers)
    sampler: Literal["always_on", "always_off", "traceidratio", "parentbased_always_on",
                     "parentbased_always_off", "parentbased_traceidratio"] | None = None
    sampler_arg: float | None = Field(default=None, ge=0, le=1)
    service_name: str | None = None  # OTEL_SERVICE_NAME (model-boss by default)
    resource_attributes: dict[str, str] = Field(default_factory=dict)  # OTEL_RESOURCE_ATTRIBUTES
    max_queue_size: int | None = Field(default=None, ge=1)  # OTEL_BSP_MAX_QUEUE_SIZE
    schedule_delay_ms: int | None = Field(default=None, ge=1)  # OTEL_BSP_SCHEDULE_DELAY
    # the dashboard links a request's trace id here: a URL with {trace_id} in it, e.g.
    # http://localhost:16686/trace/{trace_id} (Jaeger)
    trace_url: str | None = None

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not a URL: http://host:port or https://host:port")
        return value

    @field_validator("trace_url")
    @classmethod
    def _trace_url(cls, value: str | None) -> str | None:
        if value is not None and "{trace_id}" not in value:
            raise ValueError(f"{value!r} does not say where the trace id goes: put "
                             "{trace_id} in it")
        return value

    def as_environ(self) -> dict[str, str]:
        """The fields set, as the ``OTEL_*`` variables they stand for."""
        named = {
            "OTEL_TRACES_EXPORTER": None if self.enabled is None
            else "otlp" if self.enabled else "none",
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": self.protocol,
            "OTEL_EXPORTER_OTLP_HEADERS": _pairs(self.headers),
            "OTEL_EXPORTER_OTLP_TIMEOUT": _text(self.timeout_s),
            "OTEL_TRACES_SAMPLER": self.sampler,
            "OTEL_TRACES_SAMPLER_ARG": _text(self.sampler_arg),
            "OTEL_SERVICE_NAME": self.service_name,
            "OTEL_RESOURCE_ATTRIBUTES": _pairs(self.resource_attributes),
            "OTEL_BSP_MAX_QUEUE_SIZE": _text(self.max_queue_size),
            "OTEL_BSP_SCHEDULE_DELAY": _text(self.schedule_delay_ms),
        }
        return {name: value for name, value in named.items() if value}


class TracingGroup(BaseModel):
    """The ``tracing:`` section of the settings."""

    tracing: TracingSettings = Field(default_factory=TracingSettings)


def _pairs(values: dict[str, str]) -> str | None:
    return ",".join(f"{name}={value}" for name, value in values.items()) or None


def _text(value: float | None) -> str | None:
    return None if value is None else f"{value:g}"
