"""A request forwarded between two cluster members is one trace: two real coordinators on one
real Redis, each exporting to the same OTLP/HTTP receiver (decoded with opentelemetry-proto)
under its own service name. A chat sent to A for a model warm on B only: A's server span under
the caller's, A's forward span under it, B's server span under A's forward (the forward
carried ``traceparent``), and B's queue wait and worker call under B's, all one trace id."""

from __future__ import annotations

import httpx
import pytest

from tests.cluster_members import cluster, members_on_one_redis
from tests.conftest import ServerProcess, llama_manifest, wait_for
from tests.otlp_receiver import Receiver, attributes, tracing_env

pytestmark = [pytest.mark.slow, pytest.mark.redis]

SECRET = "tracing-cluster-secret"
TRACE_ID = "7cf92f3577b34da6a3ce929d0e0e4739"
PARENT_ID = "10f067aa0ba902b7"
EDGE = "POST /v1/chat/completions"


@pytest.fixture(scope="module")
def receiver():
    with Receiver() as receiving:
        yield receiving


@pytest.fixture(scope="module")
def members(tmp_path_factory, demo_gguf, receiver):
    with members_on_one_redis(
            tmp_path_factory, "tracing", [llama_manifest("m1", demo_gguf, vram_mb=3000)],
            {"cluster_heartbeat_s": 0.5, "cluster_member_ttl_s": 4.0}, SECRET,
            env=lambda host: tracing_env(receiver, service=f"member-{host}")) as servers:
        yield servers


def where(server: ServerProcess, model: str) -> dict[str, str]:
    return {p["host_id"]: p["state"] for p in cluster(server)["models"].get(model, [])}


def test_a_forwarded_request_is_one_trace(members, receiver):
    a, b = members["a"], members["b"]
    assert httpx.post(b.url + "/api/v1/models/m1/load", timeout=60).status_code == 200
    wait_for(lambda: where(a, "m1") == {"b": "ready"}, timeout=15)
    answer = httpx.post(a.url + "/v1/chat/completions", timeout=60, headers={
        "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}, json={
        "model": "m1", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-model-boss-member"] == "b"

    def both_sides() -> dict | None:
        spans = {(receiver.service_of(span), span.name): span
                 for span in receiver.of_trace(TRACE_ID)}
        wanted = {("member-a", EDGE), ("member-a", "model_boss.forward"), ("member-b", EDGE),
                  ("member-b", "model_boss.queue_wait"), ("member-b", "model_boss.worker_call")}
        return spans if wanted <= spans.keys() else None

    spans = receiver.wait(both_sides)
    assert spans, sorted((receiver.service_of(s), s.name) for s in receiver.of_trace(TRACE_ID))
    a_edge, forward = spans[("member-a", EDGE)], spans[("member-a", "model_boss.forward")]
    b_edge = spans[("member-b", EDGE)]
    assert a_edge.parent_span_id.hex() == PARENT_ID  # the caller's span
    assert forward.parent_span_id == a_edge.span_id
    assert attributes(forward)["model_boss.member"] == "b"
    assert b_edge.parent_span_id == forward.span_id  # B's request: A's forward's child
    for child in ("model_boss.queue_wait", "model_boss.worker_call"):
        assert spans[("member-b", child)].parent_span_id == b_edge.span_id, child
    assert ("member-a", "model_boss.worker_call") not in spans  # nothing served on A
    usage = answer.json()["usage"]
    assert attributes(b_edge)["gen_ai.usage.output_tokens"] == usage["completion_tokens"]


def test_a_job_taken_by_another_member_runs_linked_to_its_submit(members, receiver):
    a = members["a"]
    wait_for(lambda: where(a, "m1") == {"b": "ready"}, timeout=15)  # warm on B only
    job_trace = "8cf92f3577b34da6a3ce929d0e0e4740"
    taken = httpx.post(a.url + "/api/v1/jobs", timeout=30, headers={
        "traceparent": f"00-{job_trace}-{PARENT_ID}-01"}, json={
        "endpoint": "/v1/chat/completions", "body": {
            "model": "m1", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}})
    assert taken.status_code == 202, taken.text
    job_id = taken.json()["id"]
    wait_for(lambda: httpx.get(f"{a.url}/api/v1/jobs/{job_id}", timeout=10).json()["status"]
             == "succeeded", timeout=60)
    job = httpx.get(f"{a.url}/api/v1/jobs/{job_id}", timeout=10).json()
    submit = receiver.wait(lambda: next(iter(
        [s for s in receiver.of_trace(job_trace) if s.name == "model_boss.job.submit"]), None))
    assert submit is not None and receiver.service_of(submit) == "member-a"
    run = receiver.wait(lambda: next((s for s in receiver.named("model_boss.job.run")
                                      if any(link.span_id == submit.span_id
                                             for link in s.links)), None))
    assert run is not None, "no run linked to the submit"
    assert job["member"] == "b"  # taken from the Streams by the member where m1 is warm
    assert receiver.service_of(run) == "member-b"
    assert attributes(run)["model_boss.job.id"] == job_id
