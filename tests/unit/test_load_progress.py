"""Load progress and waiters: stage order, and who may cancel a load (the last waiter only).

Driven through gated backends: the test holds the worker's start open, moves the waiters,
then lets it pass, so every interleaving is the one the test names.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from model_boss.api.app import create_app
from model_boss.errors import LoadFailed
from model_boss.scheduling.queue import QueuedRequest
from model_boss.slots.progress import FRACTION_STEP, LoadStage, advances
from model_boss.slots.slot import SlotState

from .fakes import manifest
from .gated import GatedBackend, gated_coordinator, steps

S = SlotState
L = LoadStage


class ReportingBackend(GatedBackend):
    """Tells its stages as a worker does while it starts: loading with fractions (one too
    small a step to be news), warming, then, the worker's health answer still saying
    "loading", a report that would go backwards."""

    async def start(self, port, placement) -> None:
        self._note("start")
        for stage, fraction in (("loading", 0.25), ("loading", 0.26), ("loading", 0.75),
                                ("warming", None), ("loading", None)):
            self.on_progress(stage, fraction)
        await self.gates.passing("start")
        self.alive = True


@pytest.fixture
async def reporting(tmp_path):
    coord, gates, log = gated_coordinator(tmp_path, [manifest("p"), manifest("q", 1000)])
    coord.pool.backend_factory = lambda entry, s: ReportingBackend(entry, gates, log, False)
    await coord.start()
    yield coord, gates, log
    await coord.stop()


def progress_events(coord, model: str) -> list[dict]:
    return coord.events.recent(kind="load_progress", model=model)


@pytest.mark.parametrize(("current", "fraction", "new", "new_fraction", "news"), [
    (None, None, L.LEASING, None, True),
    (L.LEASING, None, L.STARTING, None, True),
    (L.STARTING, None, L.LOADING, None, True),
    (L.LOADING, None, L.LOADING, None, False),         # the same stage again
    (L.LOADING, None, L.LOADING, 0.1, True),           # its first fraction
    (L.LOADING, 0.1, L.LOADING, 0.1 + FRACTION_STEP / 2, False),  # too small a step
    (L.LOADING, 0.1, L.LOADING, 0.1 + FRACTION_STEP, True),
    (L.LOADING, 0.99, L.LOADING, 1.0, True),           # the end of a stage is always news
    (L.WARMING, None, L.LOADING, None, False),         # backwards
    (L.LOADING, 0.5, L.WARMING, None, True),
    (L.WARMING, None, L.READY, None, True),
    (L.STARTING, None, L.FAILED, None, True),
    (L.READY, None, L.FAILED, None, False),            # a finished load stays finished
    (L.FAILED, None, L.READY, None, False),
])
def test_what_is_news(current, fraction, new, new_fraction, news):
    assert advances(current, fraction, new, new_fraction) is news


async def test_stage_order_of_a_cold_load(reporting):
    coord, gates, _ = reporting
    gates.hold("start")
    request = asyncio.create_task(coord.queue.acquire(QueuedRequest(model_id="p", priority=5)))
    await gates.reached("start")
    held = progress_events(coord, "p")
    assert [(e["stage"], e["fraction"]) for e in held] == [
        ("leasing", None), ("starting", None), ("loading", 0.25), ("loading", 0.75),
        ("warming", None)]
    status = {s["model"]: s for s in coord.pool.status()}["p"]
    assert status["load_progress"]["stage"] == "warming" and status["waiters"] == 1
    gates.open("start")
    (await asyncio.wait_for(request, 2)).release()
    events = progress_events(coord, "p")
    assert [e["stage"] for e in events][-1] == "ready" and len(events) == len(held) + 1
    elapsed = [e["elapsed_s"] for e in events]
    assert elapsed == sorted(elapsed) and all(e["model"] == "p" for e in events)
    assert coord.pool.owners["p"].progress is None  # no load in flight any more


async def test_a_failed_load_ends_in_failed(tmp_path):
    coord, gates, log = gated_coordinator(tmp_path, [manifest("p")])

    class Failing(GatedBackend):
        async def start(self, port, placement) -> None:
            raise RuntimeError("weights are corrupt")

    coord.pool.backend_factory = lambda entry, s: Failing(entry, gates, log, False)
    await coord.start()
    try:
        with pytest.raises(LoadFailed):
            await coord.queue.acquire(QueuedRequest(model_id="p", priority=5))
        stages = [(e["stage"], e.get("error")) for e in progress_events(coord, "p")]
        assert [s for s, _ in stages] == ["leasing", "starting", "failed"]
        assert "weights are corrupt" in stages[-1][1]
    finally:
        await coord.stop()


async def test_a_load_another_request_waits_for_goes_on(reporting):
    coord, gates, log = reporting
    gates.hold("start")
    leaving = asyncio.create_task(coord.queue.acquire(QueuedRequest(model_id="p", priority=5)))
    staying = asyncio.create_task(coord.queue.acquire(QueuedRequest(model_id="p", priority=5)))
    await gates.reached("start")
    assert coord.pool.owners["p"].waiters == 2
    leaving.cancel()  # its client went away
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert coord.pool.is_loading("p") and coord.pool.owners["p"].waiters == 1
    gates.open("start")
    ticket = await asyncio.wait_for(staying, 2)
    assert ticket.slot.state == S.READY and steps(log, "start", "p") == 1
    assert not coord.events.recent(kind="load_cancelled")
    ticket.release()


async def test_an_admin_load_counts_as_a_waiter(reporting):
    coord, gates, _ = reporting
    gates.hold("start")
    admin = asyncio.create_task(coord.pool.ensure_ready("p", 5))
    await gates.reached("start")
    request = asyncio.create_task(coord.queue.acquire(QueuedRequest(model_id="p", priority=5)))
    await asyncio.sleep(0.05)
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    assert coord.pool.is_loading("p")
    gates.open("start")
    assert (await asyncio.wait_for(admin, 2)).state == S.READY


async def test_the_last_waiter_leaving_cancels_the_load(reporting):
    coord, gates, log = reporting
    gates.hold("start")
    request = asyncio.create_task(coord.queue.acquire(QueuedRequest(model_id="p", priority=5)))
    await gates.reached("start")
    lease = coord.pool.slots["p"].lease
    assert lease is not None and lease.id in {x.id for x in await coord.boss.leases()}
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    owner = coord.pool.owners["p"]
    for _ in range(100):  # the stop runs as the load's own clean-up
        if not owner.busy:
            break
        await asyncio.sleep(0.01)
    slot = coord.pool.slots["p"]
    assert slot.state == S.IDLE and slot.backend is None and slot.lease is None
    assert await coord.boss.leases() == []
    assert steps(log, "stop", "p") == 1  # the worker it started is stopped
    assert coord.events.recent(kind="load_cancelled", model="p")
    assert progress_events(coord, "p")[-1]["stage"] == "failed"
    # the model loads again for the next request, on a fresh worker
    gates.open("start")
    ticket = await asyncio.wait_for(
        coord.queue.acquire(QueuedRequest(model_id="p", priority=5)), 2)
    assert steps(log, "start", "p") == 2
    ticket.release()


async def test_a_cancel_while_leasing_leaves_no_lease(reporting):
    """The last waiter leaves while the load waits for room (another model is evicted)."""
    coord, gates, _ = reporting
    (await coord.queue.acquire(QueuedRequest(model_id="q", priority=5))).release()
    gates.hold("stop")  # q's eviction holds the load in "leasing"
    request = asyncio.create_task(coord.queue.acquire(QueuedRequest(model_id="p", priority=5)))
    await gates.reached("stop")
    assert progress_events(coord, "p")[-1]["stage"] == "leasing"
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    gates.open("stop")
    for _ in range(100):
        if not coord.pool.owners["p"].busy and not coord.pool.owners["q"].busy:
            break
        await asyncio.sleep(0.01)
    assert coord.pool.slots["p"].state == S.IDLE
    assert [x.note for x in await coord.boss.leases()] == []


async def test_queue_listing_order_and_positions(tmp_path):
    coord, gates, _ = gated_coordinator(tmp_path, [manifest("p", 1000), manifest("q", 1000)],
                                        admin_api_key="admin-key")
    app = create_app(coordinator=coord)
    await coord.start()
    try:
        busy = await coord.queue.acquire(QueuedRequest(model_id="p", priority=5))  # p is full
        asks = [("late-low", 9, "p"), ("urgent", 1, "p"), ("normal-a", 5, "p"),
                ("normal-b", 5, "p")]
        waiting = []
        for client, priority, model in asks:
            waiting.append(asyncio.create_task(coord.queue.acquire(QueuedRequest(
                model_id=model, priority=priority, client_id=client,
                endpoint="/v1/chat/completions"))))
            await asyncio.sleep(0.01)  # distinct submission times
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            assert (await client.get("/api/v1/queue")).status_code == 401
            listed = (await client.get("/api/v1/queue",
                                       headers={"authorization": "Bearer admin-key"})).json()
        rows = listed["waiting"]
        assert [r["client_id"] for r in rows] == ["urgent", "normal-a", "normal-b", "late-low"]
        assert [r["position"] for r in rows] == [1, 2, 3, 4]
        assert [r["request_id"] for r in rows] == [r.request_id for r in coord.queue.ordered()]
        assert all(r["model"] == "p" and r["endpoint"] == "/v1/chat/completions"
                   and r["waited_s"] >= 0 for r in rows)
        assert set(rows[0]) == {"request_id", "model", "priority", "client_id", "position",
                                "waited_s", "deadline_in_s", "endpoint"}
        from model_boss.scheduling.waiting import queue_status

        status_rows = queue_status(coord.queue)["waiting"]  # one shape in both places
        assert [set(r) for r in status_rows] == [set(r) for r in rows]
        assert [r["request_id"] for r in status_rows] == [r["request_id"] for r in rows]
        assert listed["total"] == 4 and listed["offset"] == 0
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1",
                                     headers={"authorization": "Bearer admin-key"}) as client:
            page = (await client.get("/api/v1/queue", params={"limit": 2, "offset": 1})).json()
            bad = await client.get("/api/v1/queue", params={"limit": 0})
        assert [(r["client_id"], r["position"]) for r in page["waiting"]] == [
            ("normal-a", 2), ("normal-b", 3)] and page["total"] == 4
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"
        busy.release()  # the first in line is served; everyone moves up
        first = await asyncio.wait_for(waiting[1], 2)
        assert first.request.client_id == "urgent"
        from model_boss.scheduling.waiting import waiting_list

        assert [(r["client_id"], r["position"]) for r in waiting_list(coord.queue)] == [
            ("normal-a", 1), ("normal-b", 2), ("late-low", 3)]
        first.release()
        for task in (waiting[2], waiting[3], waiting[0]):  # served in that order
            (await asyncio.wait_for(task, 2)).release()
        assert waiting_list(coord.queue) == []
    finally:
        await coord.stop()


async def test_a_waiting_job_shows_its_queue_position(tmp_path):
    coord, gates, _ = gated_coordinator(tmp_path, [manifest("p", 1000)])
    app = create_app(coordinator=coord)
    await coord.start()
    try:
        coord.pool.learned.observe_inference("p", 4.0)
        busy = await coord.queue.acquire(QueuedRequest(model_id="p", priority=5))
        granted_at = time.time()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            job = (await client.post("/api/v1/jobs", json={
                "endpoint": "/v1/chat/completions",
                "body": {"model": "p", "messages": [{"role": "user", "content": "hi"}]}})).json()
            for _ in range(200):
                status = (await client.get(f"/api/v1/jobs/{job['id']}")).json()
                if status["queue_position"] is not None:
                    break
                await asyncio.sleep(0.01)
            assert status["queue_position"] == 1, status
            # one request runs ahead of it on p: one learned inference time after that one
            # began (now, on a box so slow that the time has passed already)
            from datetime import datetime

            start = datetime.fromisoformat(status["estimated_start"]).timestamp()
            assert abs(start - max(time.time(), granted_at + 4.0)) <= 1.0, (
                start - granted_at, time.time() - granted_at)
            busy.release()
            for _ in range(200):
                status = (await client.get(f"/api/v1/jobs/{job['id']}")).json()
                if status["status"] == "succeeded":
                    break
                await asyncio.sleep(0.01)
        assert status["status"] == "succeeded" and status["queue_position"] is None
        assert status["estimated_start"] is None
    finally:
        await coord.stop()


async def stream_over_a_held_start(coord, gates) -> httpx.Response:
    """A streaming chat for "p" sent while its worker's start is held, then let through."""
    transport = httpx.ASGITransport(app=create_app(coordinator=coord))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        gates.hold("start")
        chat = asyncio.create_task(client.post("/v1/chat/completions", json={
            "model": "p", "stream": True, "messages": [{"role": "user", "content": "hi"}]}))
        await gates.reached("start")
        await asyncio.sleep(0.2)  # the answer begins while the start is held
        gates.open("start")
        return await asyncio.wait_for(chat, 5)


async def test_a_stream_waiting_on_a_load_gets_comment_lines(reporting, monkeypatch):
    coord, gates, _ = reporting
    monkeypatch.setattr(coord.settings, "load_comments_after_s", 0.0)  # any load counts
    answer = await stream_over_a_held_start(coord, gates)
    assert answer.status_code == 200 and answer.headers["x-model-boss-model"] == "p"
    assert answer.headers["content-type"].startswith("text/event-stream")
    first = answer.text.split("\n\n")[0]
    assert first.startswith(": loading p stage=") and first.endswith("s"), answer.text
    assert answer.text.endswith("{}")  # then the worker's answer itself


async def test_a_stream_refused_before_any_load_keeps_its_status(reporting):
    coord, _, _ = reporting
    app = create_app(coordinator=coord)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        answer = await client.post("/v1/chat/completions", json={
            "model": "nope", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 404 and answer.json()["error"]["code"]


LLAMA_OUTPUT = [  # what llama.cpp's server (native worker) prints while it starts
    "0.00.002.165 W srv          init: security: no API key is set",
    "0.00.002.714 I srv          init: loading model",
    "0.00.002.752 I srv    load_model: loading model '/models/SmolLM2-135M.gguf'",
    "0.03.020.204 I cmn          init: llama threadpool init, n_threads = 2",
    "0.03.020.300 I cmn  common_init_: warming up the model with an empty run - please wait",
    "0.12.426.752 I srv          init: model loaded",
    "0.12.442.321 I srv          init: listening on http://127.0.0.1:8080",
]


def test_llama_stages_come_from_its_output_lines():
    from types import SimpleNamespace

    from model_boss.backends.base import HttpWorkerBackend
    from model_boss.backends.llama import LlamaCppServerBackend

    reports: list[str] = []
    backend = SimpleNamespace(log_stages=LlamaCppServerBackend.log_stages,
                              _report=lambda stage, fraction=None: reports.append(stage))
    for line in LLAMA_OUTPUT:
        HttpWorkerBackend._saw_line(backend, line)
    assert reports == ["loading", "loading", "warming", "warming"]  # LoadProgress dedups


@pytest.mark.parametrize(("body", "expected"), [
    ({"state": "loading", "load": {"stage": "loading", "fraction": 0.4, "components": 5}},
     ("loading", 0.4)),
    ({"state": "loading", "load": {"stage": "loading", "fraction": None}}, ("loading", None)),
    ({"state": "loading"}, ("loading", None)),  # an older worker: no load report
    ("not json", ("loading", None)),
])
def test_diffusers_loading_fraction_from_its_health(body, expected):
    from model_boss.backends.diffusers import DiffusersBackend

    response = (httpx.Response(503, json=body) if isinstance(body, dict)
                else httpx.Response(503, text=body))
    assert DiffusersBackend.loading_stage(None, response) == expected


async def test_a_stream_whose_load_fails_after_it_started_ends_with_an_sse_error(tmp_path):
    coord, gates, log = gated_coordinator(tmp_path, [manifest("p")], load_comments_after_s=0)

    class FailsAfterGate(GatedBackend):
        async def start(self, port, placement) -> None:
            await self.gates.passing("start")
            raise RuntimeError("weights are corrupt")

    coord.pool.backend_factory = lambda entry, s: FailsAfterGate(entry, gates, log, False)
    await coord.start()
    try:
        answer = await stream_over_a_held_start(coord, gates)
        events = [e for e in answer.text.split("\n\n") if e]
        assert answer.status_code == 200 and events[0].startswith(": loading p stage=")
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2].removeprefix("data: "))["error"]
        assert "weights are corrupt" in error["message"]
    finally:
        await coord.stop()


async def test_a_stream_dropped_before_its_first_chunk_leaves_the_queue(reporting):
    """The client went as the answer began: the stream is never iterated, yet the request
    leaves the queue and the load nobody waits for is cancelled."""
    import gc

    from model_boss.services import Extensions, serve_streaming

    coord, gates, _ = reporting
    coord.settings.load_comments_after_s = 0.0
    gates.hold("start")
    served = await asyncio.wait_for(serve_streaming(
        coord, "/v1/chat/completions",
        {"model": "p", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        Extensions()), 2)
    assert served.chunks is not None and coord.queue.depth == 1
    del served
    gc.collect()
    for _ in range(100):
        if coord.queue.depth == 0 and not coord.pool.owners["p"].busy:
            break
        await asyncio.sleep(0.01)
    assert coord.queue.depth == 0 and coord.pool.owners["p"].waiters == 0
    assert coord.events.recent(kind="load_cancelled", model="p")
    assert coord.pool.slots["p"].state == S.IDLE and await coord.boss.leases() == []
