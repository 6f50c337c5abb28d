"""A real coordinator with the standard ``OTEL_*`` variables pointed at an OTLP/HTTP receiver
in this test (decoded with opentelemetry-proto): a chat request that brings a
``traceparent`` yields its server span under the caller's span, with the edge's key check
and admission (a refusal's code on the stage that refused), the queue wait, the
load it waited for (and its stages), the worker call (and llama.cpp's prompt processing and
generation, from its own timings) and the ledger's row as its children, and the token counts
on it, a streamed answer's too; the request log's row carries the trace id; a job's run is
linked to its submit; no attribute carries prompt text or a key's secret. Last, the collector
stopped midway loses spans, never a request, and the log says so once."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.conftest import ServerProcess, llama_manifest
from tests.otlp_receiver import Receiver, attributes, tracing_env

pytestmark = pytest.mark.slow

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
STREAM_TRACE_ID = "5bf92f3577b34da6a3ce929d0e0e4737"
JOB_TRACE_ID = "6bf92f3577b34da6a3ce929d0e0e4738"
PARENT_ID = "00f067aa0ba902b7"
KEY, ADMIN = "tracer-secret-0123456789", "admin-secret-0123456789"
EMBEDDER_KEY = "embedder-secret-0123456789"  # a key whose scope holds no chat
REFUSED_TRACE_ID = "abf92f3577b34da6a3ce929d0e0e4739"
UNSCOPED_TRACE_ID = "bbf92f3577b34da6a3ce929d0e0e473a"
UNTRACED_TRACE_ID, AFTER_TRACE_ID = "cbf92f3577b34da6a3ce929d0e0e473b", "d" * 32
SECRET_PROMPT = "a secret prompt"


@pytest.fixture(scope="module")
def receiver():
    with Receiver() as receiving:
        yield receiving


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf, receiver):
    srv = ServerProcess(tmp_path_factory.mktemp("tracing"),
                        {"api_keys": {"tracer": KEY, "embedder": EMBEDDER_KEY},
                         "clients": {"embedder": {"endpoints": ["embeddings"]}},
                         "admin_api_key": ADMIN},
                        [llama_manifest("smol", demo_gguf)], env=tracing_env(receiver))
    srv.start()
    yield srv
    srv.stop()


def traced(trace_id: str) -> dict[str, str]:
    return {"traceparent": f"00-{trace_id}-{PARENT_ID}-01", "tracestate": "vendor=1",
            "authorization": f"Bearer {KEY}"}


def chat(**extra) -> dict:
    return {"model": "smol", "max_tokens": 4, "user": "end-user-7",
            "messages": [{"role": "user", "content": SECRET_PROMPT}], **extra}


def spans_named(receiver: Receiver, trace_id: str, names: set[str]) -> dict:
    """The trace's spans by name, once every one of ``names`` has come (polled)."""
    def found() -> dict | None:
        spans = {span.name: span for span in receiver.of_trace(trace_id)}
        return spans if names <= spans.keys() else None

    return receiver.wait(found) or {span.name: span for span in receiver.of_trace(trace_id)}


def no_secrets_in(spans: list) -> None:
    every_value = str([span.attributes for span in spans])
    assert SECRET_PROMPT not in every_value  # no prompt text ever
    for secret in (KEY, ADMIN, EMBEDDER_KEY, "wrong-secret"):  # nor a key's secret
        assert secret not in every_value


EDGE = "POST /v1/chat/completions"
STAGES = {"model_boss.load.leasing", "model_boss.load.starting", "model_boss.load.loading"}
TIMINGS = {"llama_cpp.prompt_processing", "llama_cpp.generation"}


def test_a_chat_request_is_one_trace_under_the_callers_span(server, receiver):
    answer = httpx.post(server.url + "/v1/chat/completions", timeout=120,
                        headers=traced(TRACE_ID), json=chat())
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    children = {"model_boss.authenticate", "model_boss.admission", "model_boss.queue_wait",
                "model_boss.load", "model_boss.worker_call", "model_boss.ledger_row"}
    spans = spans_named(receiver, TRACE_ID, {EDGE, *children, *STAGES, *TIMINGS})
    assert {EDGE, *children, *STAGES, *TIMINGS} <= spans.keys(), sorted(spans)
    edge = spans[EDGE]
    assert edge.parent_span_id.hex() == PARENT_ID
    for child in children:
        assert spans[child].parent_span_id == edge.span_id, child
    for stage in STAGES:  # the load's stages, from disk: a cold start
        assert spans[stage].parent_span_id == spans["model_boss.load"].span_id, stage
        assert attributes(spans[stage])["model_boss.load.tier"] == "disk"
    worker = spans["model_boss.worker_call"]
    for part in TIMINGS:  # llama.cpp's own timings, as the worker call's children
        assert spans[part].parent_span_id == worker.span_id, part
        assert spans[part].end_time_unix_nano <= worker.end_time_unix_nano + 1_000_000
    generation = attributes(spans["llama_cpp.generation"])
    assert generation["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    on_edge = attributes(edge)
    assert on_edge["gen_ai.request.model"] == "smol"
    assert on_edge["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert on_edge["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert on_edge["http.response.status_code"] == 200
    assert on_edge["model_boss.key"] == "tracer"  # the key's name, never its secret
    assert on_edge["model_boss.end_user"] == "end-user-7"
    assert on_edge["model_boss.slot_key"] == "smol" and "model_boss.priority" in on_edge
    wait = attributes(spans["model_boss.queue_wait"])
    assert "model_boss.priority" in wait and wait["model_boss.slot_key"] == "smol"
    assert attributes(worker)["llama_cpp.timings.predicted_n"] == usage["completion_tokens"]
    assert attributes(spans["model_boss.ledger_row"])["model_boss.ledger.outcome"] == "ok"
    for stage in ("model_boss.authenticate", "model_boss.admission"):  # the edge's, in order
        told = attributes(spans[stage])
        assert told["model_boss.edge.outcome"] == "allowed", stage
        assert told["model_boss.key"] == "tracer" and "model_boss.edge.refused_code" not in told
        assert spans[stage].end_time_unix_nano <= spans["model_boss.queue_wait"] \
            .start_time_unix_nano
    assert spans["model_boss.authenticate"].end_time_unix_nano \
        <= spans["model_boss.admission"].start_time_unix_nano
    no_secrets_in(receiver.of_trace(TRACE_ID))


@pytest.mark.parametrize(("trace_id", "key", "refused_by", "status"), [
    (REFUSED_TRACE_ID, "wrong-secret", "model_boss.authenticate", 401),
    (UNSCOPED_TRACE_ID, EMBEDDER_KEY, "model_boss.admission", 403)])
def test_a_request_refused_at_the_edge_says_which_stage_refused_it_and_why(
        server, receiver, trace_id, key, refused_by, status):
    answer = httpx.post(server.url + "/v1/chat/completions", timeout=30, json=chat(),
                        headers={**traced(trace_id), "authorization": f"Bearer {key}"})
    assert answer.status_code == status, answer.text
    spans = spans_named(receiver, trace_id, {EDGE, refused_by})
    assert {EDGE, refused_by} <= spans.keys(), sorted(spans)
    assert spans[refused_by].parent_span_id == spans[EDGE].span_id
    told = attributes(spans[refused_by])
    assert told["model_boss.edge.outcome"] == "refused"
    assert told["model_boss.edge.refused_code"] == answer.json()["error"]["code"]
    assert told["http.response.status_code"] == status
    assert attributes(spans[EDGE])["http.response.status_code"] == status
    # nothing past the stage that refused it
    assert not {"model_boss.queue_wait", "model_boss.worker_call"} & spans.keys()
    if refused_by == "model_boss.admission":  # the key was good: its name, never its secret
        assert attributes(spans["model_boss.authenticate"])["model_boss.key"] == "embedder"
        assert told["model_boss.key"] == "embedder"
    else:
        assert "model_boss.admission" not in spans
    no_secrets_in(receiver.of_trace(trace_id))


def test_a_streamed_answer_has_its_token_counts_and_its_stream_span(server, receiver):
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=120,
                      headers=traced(STREAM_TRACE_ID),
                      json=chat(stream=True, stream_options={"include_usage": True})) as streamed:
        assert streamed.status_code == 200, streamed.read()
        text = "\n".join(streamed.iter_lines())
    usage = next(line for line in text.splitlines() if '"usage":{' in line)
    names = {EDGE, "model_boss.stream", "model_boss.worker_call", *TIMINGS}
    spans = spans_named(receiver, STREAM_TRACE_ID, names)
    assert names <= spans.keys(), sorted(spans)
    edge = spans[EDGE]
    assert spans["model_boss.stream"].parent_span_id == edge.span_id
    on_edge = attributes(edge)
    assert f'"prompt_tokens":{on_edge["gen_ai.usage.input_tokens"]}' in usage
    assert f'"completion_tokens":{on_edge["gen_ai.usage.output_tokens"]}' in usage
    assert attributes(spans["model_boss.worker_call"])["gen_ai.usage.output_tokens"] \
        == on_edge["gen_ai.usage.output_tokens"]
    assert "model_boss.load" not in spans  # warm: nothing waited for
    no_secrets_in(receiver.of_trace(STREAM_TRACE_ID))


def test_a_route_not_traced_makes_no_edge_span(server, receiver):
    listed = httpx.get(server.url + "/v1/models", timeout=30, headers=traced(UNTRACED_TRACE_ID))
    assert listed.status_code == 200, listed.text
    # a traced request after it: the exporter sends spans in the order they end, so once this
    # one's have come, any the listing made would have come too
    after = httpx.post(server.url + "/v1/chat/completions", timeout=30, json=chat(),
                       headers={**traced(AFTER_TRACE_ID), "authorization": "Bearer wrong"})
    assert after.status_code == 401, after.text
    assert "model_boss.authenticate" in spans_named(receiver, AFTER_TRACE_ID,
                                                    {EDGE, "model_boss.authenticate"})
    assert not receiver.of_trace(UNTRACED_TRACE_ID)
    # nor a trace of its own: every key check is a request span's child
    assert all(span.parent_span_id for span in receiver.named("model_boss.authenticate"))


def test_the_request_log_row_carries_the_trace_id(server):
    rows = httpx.get(server.url + "/api/v1/requests", timeout=10,
                     headers={"authorization": f"Bearer {ADMIN}"}).json()["requests"]
    assert {TRACE_ID, STREAM_TRACE_ID} <= {row.get("trace_id") for row in rows}, rows


def test_a_jobs_run_is_linked_to_its_submit(server, receiver):
    taken = httpx.post(server.url + "/api/v1/jobs", timeout=30, headers=traced(JOB_TRACE_ID),
                       json={"endpoint": "/v1/chat/completions", "body": chat()})
    assert taken.status_code == 202, taken.text
    job_id = taken.json()["id"]
    deadline = time.monotonic() + 60
    while (job := httpx.get(f"{server.url}/api/v1/jobs/{job_id}", timeout=10,
                            headers=traced(JOB_TRACE_ID)).json())["status"] != "succeeded":
        assert time.monotonic() < deadline and job["status"] not in ("failed", "cancelled"), job
        time.sleep(0.1)
    submit = spans_named(receiver, JOB_TRACE_ID, {"model_boss.job.submit"})
    assert "model_boss.job.submit" in submit, sorted(submit)
    assert submit["model_boss.job.submit"].parent_span_id == submit["POST /api/v1/jobs"].span_id
    submit_span = submit["model_boss.job.submit"]

    def the_run():
        return next((span for span in receiver.named("model_boss.job.run")
                     if any(link.span_id == submit_span.span_id for link in span.links)), None)

    run = receiver.wait(the_run)
    assert run is not None, "no job run linked to the submit"
    link = next(link for link in run.links if link.span_id == submit_span.span_id)
    assert link.trace_id.hex() == JOB_TRACE_ID
    assert run.trace_id.hex() != JOB_TRACE_ID  # a trace of its own, linked
    assert attributes(run)["model_boss.job.id"] == job_id
    run_spans = spans_named(receiver, run.trace_id.hex(), {"model_boss.worker_call"})
    assert run_spans["model_boss.worker_call"].parent_span_id == run.span_id
    assert attributes(run)["gen_ai.usage.output_tokens"] == job["result"]["usage"][
        "completion_tokens"]
    no_secrets_in(receiver.of_trace(JOB_TRACE_ID) + receiver.of_trace(run.trace_id.hex()))


def test_the_collector_stopped_midway_loses_spans_not_requests(tmp_path, demo_gguf):
    collector = Receiver()
    srv = ServerProcess(tmp_path, {}, [llama_manifest("smol", demo_gguf)],
                        env={**tracing_env(collector), "OTEL_EXPORTER_OTLP_TIMEOUT": "1"})
    srv.start()
    try:
        def ask(trace_id: str) -> float:
            began = time.monotonic()
            answer = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json=chat(),
                                headers={"traceparent": f"00-{trace_id}-{PARENT_ID}-01"})
            assert answer.status_code == 200, answer.text
            return time.monotonic() - began

        before = "7" * 32
        ask(before)
        assert collector.wait(lambda: collector.of_trace(before))
        warm_s = ask("8" * 32)
        port = collector.port
        collector.close()  # the collector stops
        lost = [f"{n:032x}" for n in range(1, 9)]
        times = [ask(trace_id) for trace_id in lost]
        # no request failed, and none waited on the exporter (it retries on its own thread)
        assert max(times) < warm_s + 2.0, (times, warm_s)
        said = "cannot be reached; spans are dropped"
        deadline = time.monotonic() + 30
        while srv.log().count(said) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # later batches fail too: still one line
        assert srv.log().count(said) == 1, srv.log()[-3000:]
        back = Receiver(port)  # it comes back: spans flow again, and the log says so
        try:
            after = "9" * 32
            ask(after)
            assert back.wait(lambda: back.of_trace(after), deadline_s=30)
            assert "answers again" in srv.log()
        finally:
            back.close()
    finally:
        srv.stop()
