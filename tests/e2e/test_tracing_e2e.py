"""A real coordinator with the standard ``OTEL_*`` variables pointed at an OTLP/HTTP receiver
in this test (decoded with opentelemetry-proto): a chat request that brings a
``traceparent`` yields its server span under the caller's span, with the queue wait, the
load it waited for and the worker call as its children, and the token counts on it."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.conftest import ServerProcess, free_port, llama_manifest

pytestmark = pytest.mark.slow

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Receiver:
    """POST /v1/traces: every span received, as opentelemetry-proto decodes it."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        spans = self.spans = []
        lock = self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                with lock:
                    spans.extend(span for resource in request.resource_spans
                                 for scope in resource.scope_spans for span in scope.spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.port = free_port()
        self.http = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def of_trace(self, trace_id: str) -> list:
        with self.lock:
            return [span for span in self.spans if span.trace_id.hex() == trace_id]

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture(scope="module")
def receiver():
    receiving = Receiver()
    yield receiving
    receiving.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf, receiver):
    env = {"OTEL_TRACES_EXPORTER": "otlp",
           "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
           "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_SERVICE_NAME": "boss-under-test",
           "OTEL_TRACES_SAMPLER": "parentbased_always_on",
           "OTEL_BSP_SCHEDULE_DELAY": "50"}  # sent soon, so the test's wait is short
    srv = ServerProcess(tmp_path_factory.mktemp("tracing"), {},
                        [llama_manifest("smol", demo_gguf)], env=env)
    srv.start()
    yield srv
    srv.stop()


def spans_named(receiver: Receiver, names: set[str], deadline_s: float = 60.0) -> dict:
    """The trace's spans by name, once every one of ``names`` has come (polled)."""
    deadline = time.monotonic() + deadline_s
    while True:
        spans = {span.name: span for span in receiver.of_trace(TRACE_ID)}
        if names <= spans.keys() or time.monotonic() > deadline:
            return spans
        time.sleep(0.05)


def test_a_chat_request_is_one_trace_under_the_callers_span(server, receiver):
    answer = httpx.post(server.url + "/v1/chat/completions", timeout=120, headers={
        "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "tracestate": "vendor=1"}, json={
        "model": "smol", "max_tokens": 4,
        "messages": [{"role": "user", "content": "a secret prompt"}]})
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    edge_name = "POST /v1/chat/completions"
    spans = spans_named(receiver, {edge_name, "model_boss.queue_wait", "model_boss.load",
                                   "model_boss.worker_call"})
    assert {edge_name, "model_boss.queue_wait", "model_boss.load",
            "model_boss.worker_call"} <= spans.keys(), sorted(spans)
    edge = spans[edge_name]
    assert edge.parent_span_id.hex() == PARENT_ID
    for child in ("model_boss.queue_wait", "model_boss.load", "model_boss.worker_call"):
        assert spans[child].parent_span_id == edge.span_id, child
    attributes = {kv.key: kv.value for kv in edge.attributes}
    assert attributes["gen_ai.request.model"].string_value == "smol"
    assert attributes["gen_ai.usage.input_tokens"].int_value == usage["prompt_tokens"]
    assert attributes["gen_ai.usage.output_tokens"].int_value == usage["completion_tokens"]
    assert attributes["http.response.status_code"].int_value == 200
    wait = {kv.key: kv.value for kv in spans["model_boss.queue_wait"].attributes}
    assert "model_boss.priority" in wait and wait["model_boss.slot_key"].string_value == "smol"
    every_value = str([span.attributes for span in receiver.of_trace(TRACE_ID)])
    assert "secret prompt" not in every_value  # no prompt text ever
