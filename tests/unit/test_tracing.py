"""Tracing is off without the OTEL_* variables (no provider, nothing of the SDK imported);
on, a worker call carries the current span as ``traceparent`` even with the collector
unreachable. The "on" cases run in a child process: the tracer provider is process-global."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from model_boss import trace_context
from model_boss.observability import tracing


@pytest.mark.parametrize(("environ", "on"), [
    ({}, False),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "console,otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
])
def test_wanted_reads_the_standard_variables(environ, on):
    assert tracing.wanted(environ) is on


def test_off_builds_no_provider_and_adds_no_header():
    assert tracing.configure({}) is None
    with tracing.span("anything") as span:
        assert span is None
    assert tracing.current_span() is None
    headers = {"a": "b"}
    assert trace_context.carried(headers) is headers


def _run(script: str, **env: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_off_imports_nothing_of_the_sdk_or_the_exporter():
    # opentelemetry-api itself comes with FastAPI (its own telemetry module imports it)
    out = _run("""
        import sys
        from model_boss.api.app import create_app
        from model_boss.observability import tracing
        assert tracing.configure() is None
        print(sorted(m for m in sys.modules if m.startswith(
            ("opentelemetry.sdk", "opentelemetry.exporter", "opentelemetry.proto"))))
    """)
    assert out.strip() == "[]"


def test_on_a_worker_call_carries_the_span_and_an_unreachable_collector_fails_nothing():
    out = _run("""
        import asyncio, threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from model_boss.backends.upstream import UpstreamClient
        from model_boss.observability import tracing

        seen = {}
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                seen.update(self.headers)
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
            def log_message(self, *args):
                pass
        worker = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=worker.serve_forever, daemon=True).start()

        async def main():
            assert tracing.configure() is not None
            client = UpstreamClient(f"http://127.0.0.1:{worker.server_port}", timeout_s=30)
            with tracing.start_server_span("edge", {}) as edge:
                with tracing.span("model_boss.worker_call", client=True) as call:
                    reply = await client.post("/x", b"{}", {"h": "v"}, False)
            await client.close()
            assert reply.status == 200
            ids = call.get_span_context()
            assert edge.get_span_context().trace_id == ids.trace_id
            print(seen["traceparent"].startswith(f"00-{ids.trace_id:032x}-{ids.span_id:016x}-"))
        asyncio.run(main())
        tracing.shutdown()  # the collector is unreachable: spans are dropped, nothing raised
    """, OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
        OTEL_EXPORTER_OTLP_TIMEOUT="1", PATH="/usr/bin:/bin")
    assert out.strip() == "True"
