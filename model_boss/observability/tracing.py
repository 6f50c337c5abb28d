"""Tracing: OpenTelemetry spans for a request's stages, exported over OTLP/HTTP.

Off unless the standard ``OTEL_*`` variables ask for it (:func:`wanted`); off, nothing of
OpenTelemetry's SDK or exporter is imported and :func:`span` hands out a shared null
context. On, one ``TracerProvider`` is built with a ``BatchSpanProcessor``: spans wait in a capped queue and
go out from its own thread, so a collector that is slow or gone drops spans (the SDK logs
it) and never holds up a request. The SDK itself reads the sampler
(``OTEL_TRACES_SAMPLER``), the resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``),
the endpoint (``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``) and the queue's cap
(``OTEL_BSP_MAX_QUEUE_SIZE``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .. import trace_context

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

__all__ = ["SERVICE", "annotate", "configure", "current_span", "ended_span", "shutdown", "span",
           "start_server_span", "wanted"]

log = logging.getLogger(__name__)

SERVICE = "model-boss"
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_NULL = contextlib.nullcontext(None)
_tracer: Tracer | None = None
_provider: TracerProvider | None = None


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


def configure(environ: Mapping[str, str] | None = None) -> TracerProvider | None:
    """Build the provider once, if :func:`wanted`; None (and nothing imported) when off."""
    global _tracer, _provider
    environ = os.environ if environ is None else environ
    if _provider is not None or not wanted(environ):
        return _provider
    protocol = next((environ[name] for name in _PROTOCOLS if environ.get(name)), "http/protobuf")
    if protocol.strip().lower() != "http/protobuf":
        log.warning("OTEL exporter protocol %r is not supported (only http/protobuf): "
                    "traces stay off", protocol)
        return None
    from opentelemetry import propagate, trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({} if environ.get("OTEL_SERVICE_NAME")
                               else {"service.name": SERVICE})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _provider, _tracer = provider, provider.get_tracer("model_boss")
    trace_context.install(propagate.inject)
    log.info("traces: exported over OTLP/HTTP")
    return provider


def shutdown() -> None:
    """Send what is queued and stop (the daemon's exit)."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _provider = _tracer = None
    trace_context.install(None)


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


def ended_span(name: str, start_ns: int, end_ns: int,
               attributes: Mapping[str, Any] | None = None) -> None:
    """A finished stage told afterwards (a load the request waited for), under the current."""
    if _tracer is not None:
        _tracer.start_span(name, attributes=_clean(attributes),
                           start_time=start_ns).end(end_time=end_ns)


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


def current_span() -> Span | None:
    """The span now current, to add attributes to (None when off)."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    return trace.get_current_span()


def annotate(attributes: Mapping[str, Any]) -> None:
    """Add ``attributes`` to the current span, if tracing is on and one is recording."""
    current = current_span()
    if current is not None and current.is_recording():
        current.set_attributes(_clean(attributes))


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (attributes or {}).items() if v is not None}
