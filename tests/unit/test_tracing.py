"""Tracing is off without the OTEL_* variables (no provider, nothing of the SDK imported);
on, a worker call carries the current span as ``traceparent`` even with the collector
unreachable. The "on" cases run in a child process: the tracer provider is process-global."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from model_boss import trace_context
from model_boss.observability import tracing, worker_timings


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
        from model_boss.observability import tracing, worker_timings
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
        from model_boss.observability import tracing, worker_timings

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


def test_the_environment_wins_over_the_config_file():
    from model_boss.settings import TracingSettings

    file = TracingSettings(enabled=True, endpoint="http://file:4318", protocol="grpc",
                           sampler="traceidratio", sampler_arg=0.25, service_name="from-file",
                           resource_attributes={"deployment.environment": "lab"},
                           headers={"x-team": "a"}, max_queue_size=100)
    values = tracing.effective({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318",
                                "PATH": "/bin"}, file)
    assert values == {
        "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_TRACES_SAMPLER": "traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25", "OTEL_SERVICE_NAME": "from-file",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=lab",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-team=a", "OTEL_BSP_MAX_QUEUE_SIZE": "100"}
    assert tracing.wanted(values)
    # the file turns them off; an OTEL_* variable that says otlp turns them back on
    off = TracingSettings(enabled=False, endpoint="http://file:4318")
    assert not tracing.wanted(tracing.effective({}, off))
    assert tracing.wanted(tracing.effective({"OTEL_TRACES_EXPORTER": "otlp"}, off))
    assert tracing.effective({}, TracingSettings()) == {}  # an empty section: off
    # an empty variable is unset (compose's ${OTEL_EXPORTER_OTLP_ENDPOINT:-}): the file's wins
    assert tracing.effective({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, off)[
        "OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://file:4318"


@pytest.mark.parametrize(("section", "field", "words"), [
    ("protocol: udp", "tracing.protocol", "'http/protobuf' or 'grpc'"),
    ("endpoint: collector:4317", "tracing.endpoint", "is not a URL"),
    ("sampler_arg: 2", "tracing.sampler_arg", "less than or equal to 1"),
    ("trace_url: http://jaeger/trace", "tracing.trace_url", "{trace_id}"),
    ("exporter: otlp", "tracing.exporter", "Extra inputs are not permitted"),
])
def test_a_bad_tracing_section_names_the_file_and_field(tmp_path, section, field, words):
    from model_boss.errors import ConfigError
    from model_boss.settings import load_settings

    config = tmp_path / "model-boss.yaml"
    config.write_text(f"tracing:\n  {section}\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    assert f"{config}: {field}:" in str(caught.value) and words in str(caught.value)


def test_worker_timings_are_read_from_a_whole_answer_or_a_streams_last_event():
    whole = (b'{"usage":{"completion_tokens":4},"timings":{"cache_n":0,"prompt_n":31,'
             b'"prompt_ms":266.3,"predicted_n":4,"predicted_ms":55.1,"prompt_per_second":1}}')
    assert worker_timings.read(whole) == {"cache_n": 0, "prompt_n": 31, "prompt_ms": 266.3,
                                          "predicted_n": 4, "predicted_ms": 55.1,
                                          "prompt_per_second": 1}
    event = b'data: {"choices":[],"timings":{"prompt_n":1,"predicted_n":8}}\n\n'
    assert worker_timings.read(event) == {"prompt_n": 1, "predicted_n": 8}
    assert worker_timings.read(b'data: {"choices":[{"delta":{"content":"hi"}}]}') is None
    assert worker_timings.read(b'{"timings": {broken}') is None


def test_a_diffusers_or_transformers_workers_timings_keep_their_numbers_and_lists():
    picture = (b'{"data":[{"b64_json":"iVBO","revised_prompt":"say \\"timings\\": {}"}],'
               b'"x_model_boss":{"seed":3,"timings":{"queue_s":0.01,"denoise_s":0.5,'
               b'"decode_s":0.1,"total_s":0.61,"steps":2,"step_end_s":[0.3,0.5]}}}')
    assert worker_timings.read(picture) == {"queue_s": 0.01, "denoise_s": 0.5, "decode_s": 0.1,
                                            "total_s": 0.61, "steps": 2,
                                            "step_end_s": [0.3, 0.5]}
    embedded = (b'{"object":"list","data":[],"timings":{"batch_size":5,"batch_requests":2,'
                b'"batch_wait_ms":1.5,"batch_ms":9.25,"note":"x","flag":true,"mixed":[1,"a"]}}')
    assert worker_timings.read(embedded) == {"batch_size": 5, "batch_requests": 2,
                                             "batch_wait_ms": 1.5, "batch_ms": 9.25}


def test_load_stages_are_told_from_the_load_progress_events():
    from model_boss.observability.load_stages import LoadStages

    stages = LoadStages()
    for at, stage, extra in [(10.0, "leasing", {}), (10.5, "starting", {}),
                             (12.0, "loading", {}), (12.5, "loading", {"fraction": 0.5}),
                             (15.0, "warming", {}), (16.0, "ready", {}),
                             (20.0, "leasing", {}), (20.2, "loading", {"tier": "cpu"}),
                             (21.0, "ready", {})]:
        stages.heard({"type": "load_progress", "model": "m", "stage": stage, "ts": at, **extra})
    stages.heard({"type": "loaded", "model": "m", "ts": 16.0})  # other events: not stages
    cold = stages.of("m", 16.1)
    assert cold is not None and cold.tier == "disk"
    assert cold.spans() == [("leasing", 10.0, 10.5), ("starting", 10.5, 12.0),
                            ("loading", 12.0, 15.0), ("warming", 15.0, 16.0)]
    # a request that came while it loaded waited for the rest of it only
    assert cold.spans(since=13.0) == [("loading", 13.0, 15.0), ("warming", 15.0, 16.0)]
    onload = stages.of("m", 21.0)
    assert onload is not None and onload.tier == "cpu"
    assert onload.spans() == [("leasing", 20.0, 20.2), ("loading", 20.2, 21.0)]
    assert stages.of("m", 40.0) is None and stages.of("other", 16.0) is None
    assert stages.of("m", None) is None


def test_an_unreachable_collector_is_said_once_and_its_return_once(caplog):
    from opentelemetry.sdk.trace.export import SpanExportResult

    class Collector:
        def __init__(self):
            self.up = False

        def export(self, spans):
            if self.up is None:
                raise ConnectionError("refused")
            return SpanExportResult.SUCCESS if self.up else SpanExportResult.FAILURE

    collector = Collector()
    said = tracing._SaidOnce(collector, "http://c:4318/v1/traces")
    with caplog.at_level("WARNING", logger=tracing.log.name):
        for up in (False, False, None, False, True, True, False):
            collector.up = up
            said.export([])
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(";")[0] for line in lines] == [
        "traces: the collector at http://c:4318/v1/traces cannot be reached",
        "traces: the collector at http://c:4318/v1/traces answers again",
        "traces: the collector at http://c:4318/v1/traces cannot be reached"]


def test_the_config_file_alone_turns_traces_on_over_grpc():
    out = _run("""
        import threading
        from concurrent import futures
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as rpc
        from model_boss.observability import tracing, worker_timings
        from model_boss.settings import TracingSettings

        got = []
        class Collector(rpc.TraceServiceServicer):
            def Export(self, request, context):
                got.extend((r.resource, s) for r in request.resource_spans
                           for scope in r.scope_spans for s in scope.spans)
                return pb.ExportTraceServiceResponse()
        server = grpc.server(futures.ThreadPoolExecutor(2))
        rpc.add_TraceServiceServicer_to_server(Collector(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        section = TracingSettings(enabled=True, endpoint=f"http://127.0.0.1:{port}",
                                  protocol="grpc", service_name="from-the-file",
                                  resource_attributes={"deployment.environment": "lab"})
        assert tracing.configure({}, section) is not None
        with tracing.start_server_span("edge", {}):
            with tracing.span("model_boss.queue_wait"):
                pass
        tracing.shutdown()
        server.stop(0)
        resource = {kv.key: kv.value.string_value for kv in got[0][0].attributes}
        print(sorted(s.name for _, s in got), resource["service.name"],
              resource["deployment.environment"])
    """, PATH="/usr/bin:/bin")
    assert out.strip() == "['edge', 'model_boss.queue_wait'] from-the-file lab"


def test_an_unsupported_protocol_leaves_traces_off(caplog):
    with caplog.at_level("WARNING", logger=tracing.log.name):
        assert tracing.configure({"OTEL_TRACES_EXPORTER": "otlp",
                                  "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}) is None
    assert "not supported" in caplog.text
