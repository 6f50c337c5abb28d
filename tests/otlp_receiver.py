"""A real OTLP/HTTP receiver for the tracing tests: ``POST /v1/traces`` decoded with
opentelemetry-proto, every span kept with the service that sent it."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.conftest import free_port


class Receiver:
    """Every span received (``spans``), and ``services[i]``: the ``service.name`` of the
    resource ``spans[i]`` came under."""

    def __init__(self, port: int | None = None) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        spans: list[Any] = []
        services: list[str] = []
        self.spans, self.services = spans, services
        lock = self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                with lock:
                    for resource in request.resource_spans:
                        service = next((kv.value.string_value for kv in
                                        resource.resource.attributes
                                        if kv.key == "service.name"), "")
                        for scope in resource.scope_spans:
                            spans.extend(scope.spans)
                            services.extend(service for _ in scope.spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.http = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def of_trace(self, trace_id: str) -> list:
        with self.lock:
            return [span for span in self.spans if span.trace_id.hex() == trace_id]

    def service_of(self, span: Any) -> str:
        with self.lock:
            return next(service for kept, service in zip(self.spans, self.services, strict=True)
                        if kept is span)

    def named(self, name: str) -> list:
        with self.lock:
            return [span for span in self.spans if span.name == name]

    def wait(self, found, deadline_s: float = 60.0):
        """Poll ``found()`` until it is truthy (its value) or the deadline (its last)."""
        deadline = time.monotonic() + deadline_s
        while True:
            value = found()
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.05)

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def attributes(span: Any) -> dict[str, Any]:
    """A span's attributes as plain values."""
    plain = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        plain[kv.key] = getattr(kv.value, kind) if kind else None
    return plain


def tracing_env(receiver: Receiver, service: str = "boss-under-test") -> dict[str, str]:
    """The standard variables that point a coordinator at ``receiver``, spans sent soon."""
    return {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_SERVICE_NAME": service,
            "OTEL_TRACES_SAMPLER": "parentbased_always_on",
            "OTEL_BSP_SCHEDULE_DELAY": "50"}  # sent soon, so the tests' waits are short
