"""The W3C trace context (``traceparent``, ``tracestate``) carried on in outgoing requests.

The backends sit below the observability room, so they cannot ask it for the current span;
this seam is empty (and costs one ``is None``) until :mod:`model_boss.observability.tracing`
installs OpenTelemetry's propagator when tracing is turned on."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["carried", "install"]

Inject = Callable[[dict[str, str]], None]
_inject: Inject | None = None


def install(inject: Inject | None) -> None:
    """Set (or, with ``None``, clear) what writes the current context into headers."""
    global _inject
    _inject = inject


def carried(headers: dict[str, str]) -> dict[str, str]:
    """``headers`` with the current trace context added; the same dict when tracing is off."""
    if _inject is None:
        return headers
    out = dict(headers)
    _inject(out)
    return out
