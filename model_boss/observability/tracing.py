"""Tracing: OpenTelemetry spans for a request's stages, exported over OTLP (HTTP or gRPC).

Off unless the standard ``OTEL_*`` variables or the config file's ``tracing:`` section ask for
it (:func:`wanted`); off, nothing of OpenTelemetry's SDK or exporter is imported and
:func:`span` hands out a shared null context. On, one ``TracerProvider`` is built with a
``BatchSpanProcessor``: spans wait in a capped queue and go out from its own thread, so a
collector that is slow or gone drops spans and never holds up a request; that it cannot be
reached is said once in the log (:class:`_SaidOnce`), and once more when it answers again.

Where a value comes from, highest first: the ``OTEL_*`` variable, the config file's
``tracing:`` field (:func:`effective`), the SDK's default. Everything the SDK would read from
the environment (the sampler, the resource, the endpoint, the queue's cap) is read here from
that one merged mapping and handed to it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import trace_context

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from opentelemetry.trace import Span, Tracer

    from ..settings.tracing import TracingSettings

__all__ = ["SERVICE", "annotate", "configure", "context_headers", "current_span", "effective",
           "ended_span", "linked_span", "shutdown", "span", "start_server_span", "start_span",
           "trace_id_of", "use", "wanted"]

log = logging.getLogger(__name__)

SERVICE = "model-boss"
HTTP, GRPC = "http/protobuf", "grpc"
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_HEADERS = ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS")
_TIMEOUTS = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
_NULL = contextlib.nullcontext(None)
_tracer: Tracer | None = None
_provider: TracerProvider | None = None


def effective(environ: Mapping[str, str],
              settings: TracingSettings | None = None) -> dict[str, str]:
    """The ``OTEL_*`` values in force: the config file's ``tracing:`` section under the
    environment's own variables (an ``OTEL_*`` variable that is set wins)."""
    merged = dict(settings.as_environ()) if settings is not None else {}
    # an empty variable is as good as unset (the specification's rule)
    merged.update((name, value) for name, value in environ.items()
                  if name.startswith("OTEL_") and value.strip())
    return merged


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the environment turns traces on: ``OTEL_TRACES_EXPORTER=otlp``, or an OTLP
    endpoint with no exporter named; never under ``OTEL_SDK_DISABLED=true`` or with the
    exporter ``none``."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {name.strip().lower()
                 for name in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if name.strip()}
    if exporters:
        return "otlp" in exporters
    return any(environ.get(name) for name in _ENDPOINTS)


def _first(environ: Mapping[str, str], names: Sequence[str]) -> str | None:
    return next((environ[name] for name in names if environ.get(name)), None)


def configure(environ: Mapping[str, str] | None = None,
              settings: TracingSettings | None = None) -> TracerProvider | None:
    """Build the provider once, if :func:`wanted`; None (and nothing imported) when off."""
    global _tracer, _provider
    if _provider is not None:
        return _provider
    values = effective(os.environ if environ is None else environ, settings)
    if not wanted(values):
        return None
    protocol = (_first(values, _PROTOCOLS) or HTTP).strip().lower()
    if protocol not in (HTTP, GRPC):
        log.warning("traces: OTLP protocol %r is not supported (http/protobuf or grpc): "
                    "traces stay off", protocol)
        return None
    try:
        exporter, endpoint = _exporter(protocol, values)
    except ImportError as exc:
        log.warning("traces: %s needs the 'tracing' extra (pip install 'model-boss[tracing]'): "
                    "%s; traces stay off", protocol, exc)
        return None
    from opentelemetry import propagate, trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=_resource(values), sampler=_sampler(values))
    provider.add_span_processor(BatchSpanProcessor(
        _SaidOnce(exporter, endpoint),
        max_queue_size=_number(values, "OTEL_BSP_MAX_QUEUE_SIZE"),
        schedule_delay_millis=_number(values, "OTEL_BSP_SCHEDULE_DELAY"),
        max_export_batch_size=_number(values, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"),
        export_timeout_millis=_number(values, "OTEL_BSP_EXPORT_TIMEOUT")))
    trace.set_tracer_provider(provider)
    _provider, _tracer = provider, provider.get_tracer("model_boss")
    trace_context.install(propagate.inject)
    log.info("traces: exported over OTLP (%s) to %s", protocol, endpoint)
    return provider


def _exporter(protocol: str, values: Mapping[str, str]) -> tuple[SpanExporter, str]:
    """The OTLP exporter for ``protocol``, given the endpoint, headers and timeout in force;
    the SDK's own warning per failed batch is left to :class:`_SaidOnce`'s one line."""
    headers = _pairs(_first(values, _HEADERS) or "")
    timeout = _number(values, *_TIMEOUTS)
    logging.getLogger("opentelemetry.exporter.otlp").setLevel(logging.CRITICAL)
    if protocol == GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        endpoint = _first(values, _ENDPOINTS) or "http://localhost:4317"
        return OTLPSpanExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"),
                                headers=headers or None, timeout=timeout), endpoint
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HTTPSpanExporter,
    )

    endpoint = values.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or (
        values.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318").rstrip("/")
        + "/v1/traces")
    return HTTPSpanExporter(endpoint=endpoint, headers=headers or None,
                            timeout=timeout), endpoint


def _resource(values: Mapping[str, str]) -> Any:
    from opentelemetry.sdk.resources import Resource

    attributes: dict[str, Any] = {"service.name": SERVICE}
    attributes.update(_pairs(values.get("OTEL_RESOURCE_ATTRIBUTES", "")))
    if values.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = values["OTEL_SERVICE_NAME"]
    return Resource.create(attributes)


def _sampler(values: Mapping[str, str]) -> Any:
    from opentelemetry.sdk.trace import sampling

    name = values.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    known = sampling._KNOWN_SAMPLERS.get(name)  # the SDK's own table of the standard names
    if known is None:
        log.warning("traces: unknown sampler %r; parentbased_always_on", name)
        return sampling.DEFAULT_ON
    if name.endswith("traceidratio"):
        ratio = _number(values, "OTEL_TRACES_SAMPLER_ARG")
        return known(1.0 if ratio is None else min(1.0, max(0.0, ratio)))
    return known


def _pairs(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` (OTEL_RESOURCE_ATTRIBUTES, OTEL_EXPORTER_OTLP_HEADERS) as a mapping."""
    found = {}
    for pair in text.split(","):
        name, _, value = pair.partition("=")
        if name.strip() and value.strip():
            found[name.strip()] = value.strip()
    return found


def _number(values: Mapping[str, str], *names: str) -> Any:
    raw = _first(values, names)
    if raw is None:
        return None
    try:
        number = float(raw)
    except ValueError:
        log.warning("traces: %s=%r is not a number; the default is used", names[0], raw)
        return None
    return int(number) if number.is_integer() else number


class _SaidOnce:
    """An exporter that says once that its collector cannot be reached (spans are dropped
    meanwhile), and once that it answers again; never a line per failed batch."""

    def __init__(self, exporter: SpanExporter, endpoint: str) -> None:
        self.exporter = exporter
        self.endpoint = endpoint
        self.failing = False
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from opentelemetry.sdk.trace.export import SpanExportResult

        try:
            result = self.exporter.export(spans)
        except Exception as exc:  # an exporter's own failure drops the batch, nothing more
            log.debug("traces: export raised %s", exc)
            result = SpanExportResult.FAILURE
        with self._lock:
            failed = result != SpanExportResult.SUCCESS
            if failed and not self.failing:
                log.warning("traces: the collector at %s cannot be reached; spans are dropped "
                            "until it answers (requests are not affected)", self.endpoint)
            elif self.failing and not failed:
                log.warning("traces: the collector at %s answers again", self.endpoint)
            self.failing = failed
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


def shutdown() -> None:
    """Send what is queued and stop (the daemon's exit)."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _provider = _tracer = None
    trace_context.install(None)


def on() -> bool:
    """Whether traces are on (a provider was built)."""
    return _tracer is not None


def span(name: str, attributes: Mapping[str, Any] | None = None, *,
         start_ns: int | None = None, client: bool = False
         ) -> contextlib.AbstractContextManager[Span | None]:
    """A child of the current span for the ``with`` block (None when off)."""
    if _tracer is None:
        return _NULL
    from opentelemetry.trace import SpanKind

    return _tracer.start_as_current_span(
        name, attributes=_clean(attributes), start_time=start_ns,
        kind=SpanKind.CLIENT if client else SpanKind.INTERNAL)


def start_span(name: str, attributes: Mapping[str, Any] | None = None, *,
               parent: Span | None = None, start_ns: int | None = None,
               client: bool = False) -> Span | None:
    """A span begun now and ended by its caller (one that outlives a ``with`` block: a
    stream's), a child of ``parent`` (else of the current span); None when off."""
    if _tracer is None:
        return None
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    context = trace.set_span_in_context(parent) if parent is not None else None
    return _tracer.start_span(name, context=context, attributes=_clean(attributes),
                              start_time=start_ns,
                              kind=SpanKind.CLIENT if client else SpanKind.INTERNAL)


def use(current: Span | None) -> contextlib.AbstractContextManager[Any]:
    """``current`` as the current span for the ``with`` block, not ended at its end."""
    if current is None:
        return _NULL
    from opentelemetry import trace

    return trace.use_span(current, end_on_exit=False)


def ended_span(name: str, start_ns: int, end_ns: int,
               attributes: Mapping[str, Any] | None = None, *,
               parent: Span | None = None) -> Span | None:
    """A finished stage told afterwards (a load the request waited for), under ``parent``
    (else the current span)."""
    told = start_span(name, attributes, parent=parent, start_ns=start_ns)
    if told is not None:
        told.end(end_time=max(start_ns, end_ns))
    return told


@contextlib.contextmanager
def start_server_span(name: str, headers: Mapping[str, str],
                      attributes: Mapping[str, Any] | None = None) -> Iterator[Span | None]:
    """The request's span at the edge, its parent the caller's ``traceparent`` if any."""
    if _tracer is None:
        yield None
        return
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    parent = propagate.extract(headers)
    with _tracer.start_as_current_span(name, context=parent, kind=SpanKind.SERVER,
                                       attributes=_clean(attributes)) as server:
        yield server


@contextlib.contextmanager
def linked_span(name: str, link_to: Mapping[str, str],
                attributes: Mapping[str, Any] | None = None) -> Iterator[Span | None]:
    """A new trace's first span, linked to the span whose ``traceparent`` is in ``link_to``
    (a job's run, linked to its submit): current for the ``with`` block."""
    if _tracer is None:
        yield None
        return
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, SpanKind

    linked = trace.get_current_span(propagate.extract(link_to)).get_span_context()
    links = [Link(linked)] if linked.is_valid else []
    with _tracer.start_as_current_span(name, context=Context(), links=links,
                                       kind=SpanKind.CONSUMER,
                                       attributes=_clean(attributes)) as first:
        yield first


def context_headers() -> dict[str, str]:
    """The current span as ``traceparent``/``tracestate`` (to keep with a job); empty when
    off or outside any span."""
    return trace_context.carried({}) if _tracer is not None else {}


def current_span() -> Span | None:
    """The span now current, to add attributes to (None when off)."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    return trace.get_current_span()


def trace_id_of(current: Span | None) -> str:
    """``current``'s trace id as 32 hex digits, "" for none (off, or no valid span)."""
    if current is None:
        return ""
    ids = current.get_span_context()
    return f"{ids.trace_id:032x}" if ids.is_valid else ""


def annotate(attributes: Mapping[str, Any], on_span: Span | None = None) -> None:
    """Add ``attributes`` to ``on_span`` (else the current span), if one is recording."""
    target = on_span if on_span is not None else current_span()
    if target is not None and target.is_recording():
        target.set_attributes(_clean(attributes))


def failed(on_span: Span | None, exc: BaseException) -> None:
    """Mark ``on_span`` as failed by ``exc`` (its type; never its message, which may hold a
    prompt or a path)."""
    if on_span is None or not on_span.is_recording():
        return
    from opentelemetry.trace import Status, StatusCode

    on_span.set_attribute("error.type", type(exc).__name__)
    on_span.set_status(Status(StatusCode.ERROR))


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (attributes or {}).items() if v is not None}
