"""The dashboard's timelines: ``GET /api/v1/history`` fills as models load, are evicted and
serve (marks in order, VRAM per holder within capacity), ``?minutes`` trims it, it stays
bounded; ``GET /api/v1/requests`` lists the last requests, filtered, bounded; both ask for
the key ``/api/v1/status`` asks for. The sampler is driven by calling it, not by its timer."""

from __future__ import annotations

import time

import pytest

from model_boss.observability.history import RequestRing
from model_boss.observability.history.timeline import KEEP_S

from .fakes import coordinator, manifest, started_client

ADMIN = {"authorization": "Bearer admin-key"}
USER = {"authorization": "Bearer user-key"}


def chat(model: str, client: str = "anon") -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "secret prompt"}],
            "x_client_id": client}


@pytest.fixture
async def api(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("a", 2000), manifest("b", 3000)],
                           api_key="user-key", admin_api_key="admin-key")
    async with started_client(coord) as client:
        yield client, coord


async def ask(client, model: str, who: str = "anon") -> None:
    answer = await client.post("/v1/chat/completions", json=chat(model, who), headers=USER)
    assert answer.status_code == 200, answer.text


async def test_history_after_a_load_an_outside_lease_a_burst_and_an_eviction(api):
    client, coord = api
    await coord.history.sample()  # nothing yet
    await ask(client, "a")  # cold load of a
    await coord.history.sample()
    taken = await client.post("/api/v1/leases", headers=ADMIN,
                              json={"vram_mb": 300, "holder": "trainer"})
    assert taken.status_code == 201, taken.text
    for _ in range(5):
        await ask(client, "a")
    await coord.history.sample()
    await ask(client, "b")  # b does not fit beside a: a is evicted for it
    await coord.history.sample()

    seen = (await client.get("/api/v1/history", headers=ADMIN)).json()
    step = coord.settings.history_step_s
    assert seen["step_s"] == step and len(seen["t"]) == 4 and seen["t"] == sorted(seen["t"])
    assert seen["now"] >= seen["t"][-1]
    gpu = seen["gpus"]["0"]
    assert gpu["name"] == "sim" and gpu["capacity_mb"] == 4096
    assert gpu["held"] == {"model:a": [0, 2000, 2000, 0], "model:b": [0, 0, 0, 3000],
                           "lease:trainer": [0, 0, 300, 300]}
    for i in range(4):
        used = sum(series[i] for series in gpu["held"].values())
        assert used + gpu["free_mb"][i] <= gpu["capacity_mb"]
    assert gpu["free_mb"][0] == 4096 - 512
    a = seen["models"]["a"]["requests_per_s"]
    assert a == [0.0, 1 / step, 5 / step, 0.0]
    assert seen["models"]["b"]["requests_per_s"][-1] == 1 / step
    assert len(seen["models"]["a"]["tokens_per_s"]) == 4
    waits = seen["queue"]["wait_s"]
    assert list(waits) == [str(coord.settings.default_priority)]
    assert waits[str(coord.settings.default_priority)][0] is None
    assert all(w is not None and w >= 0 for w in waits[str(coord.settings.default_priority)][1:])
    assert all(n == 0 for n in seen["queue"]["depth"].get("5", [0]))
    assert seen["cpu_tier_mb"] == [0, 0, 0, 0]
    marks = [(m["type"], m["model"], m["gpu"], m["reason"]) for m in seen["marks"]]
    assert marks == [("load", "a", 0, None), ("evict", "a", 0, "for b"), ("load", "b", 0, None)]
    assert seen["marks"][0]["t"] <= seen["marks"][1]["t"] <= seen["marks"][2]["t"]


async def test_a_second_copy_adds_no_rate_series_of_its_own(api):
    client, coord = api
    await ask(client, "a")
    coord.pool.add_replica("a")  # its second copy's slot, a#2, as scaling out makes it
    await coord.history.sample()
    seen = (await client.get("/api/v1/history", headers=ADMIN)).json()
    assert "a#2" not in seen["models"]  # requests are counted per model
    assert seen["models"]["a"]["requests_per_s"] == [1 / coord.settings.history_step_s]


async def test_idle_unloads_are_evictions_and_asked_ones_unloads(api):
    client, coord = api
    await ask(client, "a")
    await ask(client, "b")  # evicts a
    unloaded = await client.post("/api/v1/models/b/unload", headers=ADMIN)
    assert unloaded.json()["unloaded"]
    coord.events.emit("unloaded", model="a", reason="stay-warm expired")
    coord.events.emit("worker_crashed", model="b", reason="killed", code=-9)
    coord.events.emit("load_progress", model="b")  # not a mark
    marks = [(m["type"], m["reason"]) for m in coord.history.render()["marks"]]
    assert marks == [("load", None), ("evict", "for b"), ("load", None),
                     ("unload", "unload requested"), ("evict", "idle"),
                     ("crash", "killed (exit -9)")]


async def test_minutes_trims_the_series_and_the_marks(api):
    client, coord = api
    empty = (await client.get("/api/v1/history", headers=ADMIN)).json()  # before a sample
    assert empty["t"] == [] and empty["gpus"]["0"]["capacity_mb"] == 4096
    assert empty["gpus"]["0"]["free_mb"] == [] and empty["marks"] == []
    now = time.time()
    history = coord.history
    for minutes_ago in (40, 10, 0):
        await history.sample(now=now - minutes_ago * 60)
    history.on_event({"type": "loaded", "model": "a", "ts": now - 30 * 60})
    history.on_event({"type": "loaded", "model": "b", "ts": now - 60})

    async def get(minutes: int | None) -> dict:
        query = "" if minutes is None else f"?minutes={minutes}"
        answer = await client.get(f"/api/v1/history{query}", headers=ADMIN)
        assert answer.status_code == 200, answer.text
        return answer.json()

    assert len((await get(None))["t"]) == 3 and len((await get(None))["marks"]) == 2
    last_20 = await get(20)
    assert len(last_20["t"]) == 2 and len(last_20["gpus"]["0"]["free_mb"]) == 2
    assert [m["model"] for m in last_20["marks"]] == ["b"]
    last_5 = await get(5)
    assert len(last_5["t"]) == 1 and last_5["cpu_tier_mb"] == [0]
    for wrong in (0, 61):
        answer = await client.get(f"/api/v1/history?minutes={wrong}", headers=ADMIN)
        assert answer.status_code == 400, answer.text  # never FastAPI's 422
        assert answer.json()["error"]["param"] == "minutes", answer.text


async def test_the_history_keeps_only_the_last_hour(api):
    _, coord = api
    history = coord.history
    steps = int(KEEP_S / history.step_s) + 10
    start = time.time() - steps * history.step_s
    for i in range(steps):
        await history.sample(now=start + i * history.step_s)
    assert len(history.steps) <= KEEP_S / history.step_s + 1
    assert history.steps[-1].t == pytest.approx(start + (steps - 1) * history.step_s, abs=0.01)
    assert len(history.render()["t"]) <= KEEP_S / history.step_s + 1


async def test_tokens_the_answers_report_are_counted(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("a", 2000)], backend_kwargs={"tokens": 7})
    async with started_client(coord) as client:
        for _ in range(3):
            answer = await client.post("/v1/chat/completions", json=chat("a"))
            assert answer.status_code == 200, answer.text
        await coord.history.sample()
        rows = (await client.get("/api/v1/requests")).json()["requests"]
        seen = (await client.get("/api/v1/history")).json()
    assert [r["tokens"] for r in rows] == [7, 7, 7]
    assert seen["models"]["a"]["tokens_per_s"] == [21 / coord.settings.history_step_s]


async def test_a_stream_counts_the_tokens_its_last_event_says(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("a", 2000)],
                           backend_kwargs={"tokens": 9, "streams": True})
    async with started_client(coord) as client:
        async with client.stream("POST", "/v1/chat/completions",
                                 json={**chat("a"), "stream": True}) as answer:
            assert answer.status_code == 200
            body = b"".join([chunk async for chunk in answer.aiter_bytes()])
        assert b'"completion_tokens": 9' in body
        await coord.history.sample()
        rows = (await client.get("/api/v1/requests")).json()["requests"]
        seen = (await client.get("/api/v1/history")).json()
    assert [(r["tokens"], r["endpoint"]) for r in rows] == [(9, "/v1/chat/completions")]
    assert seen["models"]["a"]["tokens_per_s"] == [9 / coord.settings.history_step_s]


async def test_rows_say_the_load_waited_for_and_the_task_and_rung(tmp_path):
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text("tasks:\n  ask:\n    candidates: [embedder, a]\n")
    embedder = manifest("embedder", 500, backend="transformers", category="embedding")
    coord, _ = coordinator(tmp_path, [embedder, manifest("a", 2000)], tasks_file=tasks,
                           backend_kwargs={"load_s": 0.3})
    async with started_client(coord) as client:
        for model in ("task:ask", "a"):  # the first waits for a's load, the second does not
            answer = await client.post("/v1/chat/completions", json=chat(model))
            assert answer.status_code == 200, answer.text
        second, first = (await client.get("/api/v1/requests")).json()["requests"]
    assert (first["task"], first["rung"]) == ("ask", 1)  # rung 0 serves no chat: passed over
    assert 0.25 <= first["load_wait_s"] <= first["queue_wait_s"] + 0.01
    assert (second["task"], second["rung"], second["load_wait_s"]) == (None, None, 0.0)


@pytest.mark.parametrize("chars", [500, 6])
async def test_prompts_are_kept_only_when_capture_is_on_and_cut(tmp_path, chars):
    coord, _ = coordinator(tmp_path, [manifest("a", 2000)], capture_prompts=True,
                           capture_prompt_chars=chars)
    async with started_client(coord) as client:
        parts = {"model": "a", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "secret"}, {"type": "text", "text": "prompt"}]}]}
        for body in (chat("a"), parts, {"model": "a", "prompt": "secret prompt"}):
            endpoint = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
            answer = await client.post(endpoint, json=body)
            assert answer.status_code == 200, answer.text
        rows = (await client.get("/api/v1/requests")).json()["requests"]
    assert [r["prompt"] for r in rows] == ["secret prompt"[:chars]] * 3


@pytest.mark.parametrize(("body", "tokens"), [
    (b'{"usage": {"prompt_tokens": 3, "completion_tokens": 12}}', 12),
    (b'{"usage": {"input_tokens": 3, "output_tokens": 5}}', 5),
    (b'{"content": "hi", "tokens_predicted": 4, "timings": {"predicted_n": 4}}', 4),
    (b'{"done": true, "eval_count": 6}', 6),
    (b'{"ok": true}', None), (None, None)])
def test_tokens_in_reads_what_an_answer_says(body, tokens):
    from model_boss.services.served import tokens_in

    assert tokens_in(body) == tokens


def test_the_request_ring_is_bounded_and_newest_first():
    ring = RequestRing(None, keep=3)
    for i in range(5):
        ring.write(model="a", priority=5, duration=0.1, size_mb=1, client_id=f"c{i}",
                   ok=i != 4, submitted_at=time.time() - 1)
    assert len(ring) == 3
    rows = ring.recent()
    assert [r["client_id"] for r in rows] == ["c4", "c3", "c2"]
    assert rows[0]["status"] == "failed" and rows[1]["status"] == "ok"
    assert 0.8 <= rows[0]["queue_wait_s"] <= 1.0
    assert ring.recent(limit=1, client="c3")[0]["client_id"] == "c3"


async def test_requests_lists_the_last_ones_filtered_by_model_and_client(api):
    client, _ = api
    for model, who in (("a", "alice"), ("a", "bob"), ("b", "alice"), ("a", "alice")):
        await ask(client, model, who)

    async def rows(query: str = "") -> list[dict]:
        answer = await client.get(f"/api/v1/requests{query}", headers=ADMIN)
        assert answer.status_code == 200, answer.text
        return answer.json()["requests"]

    every = await rows()
    # with keys, the client is the key; the client id it named is the end user under it
    assert [(r["model"], r["client_id"], r["end_user"]) for r in every] == [
        ("a", "default", "alice"), ("b", "default", "alice"), ("a", "default", "bob"),
        ("a", "default", "alice")]
    assert set(every[0]) == {"t", "model", "client_id", "end_user", "priority",
                             "queue_wait_s", "load_wait_s", "duration_s", "tokens", "status",
                             "task", "rung", "endpoint"}
    assert "secret prompt" not in str(every)
    assert all(r["status"] == "ok" and r["duration_s"] >= 0 for r in every)
    assert [r["end_user"] for r in await rows("?model=a")] == ["alice", "bob", "alice"]
    assert [r["model"] for r in await rows("?client=alice")] == ["a", "b", "a"]
    assert [(r["model"], r["end_user"]) for r in await rows("?model=a&client=bob")] == [
        ("a", "bob")]
    assert len(await rows("?client=default")) == 4
    assert len(await rows("?limit=2")) == 2


@pytest.mark.parametrize("headers", [{}, USER, ADMIN], ids=["no key", "user key", "admin key"])
async def test_both_ask_for_the_key_status_asks_for(api, headers):
    client, _ = api
    expected = (await client.get("/api/v1/status", headers=headers)).status_code
    for path in ("/api/v1/history", "/api/v1/requests"):
        assert (await client.get(path, headers=headers)).status_code == expected, path
    assert expected == (200 if headers is ADMIN else 401)


def test_the_grafana_board_reads_only_metrics_the_daemon_exports():
    import json
    import re
    from pathlib import Path

    from model_boss.observability.metrics import Metrics

    board = json.loads((Path(__file__).parents[2] / "docs" / "grafana-board.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    used = {re.sub(r"_(bucket|sum|count)$", "", name)
            for e in exprs for name in re.findall(r"model_boss_\w+", e)}
    exported = {m.name + ("_total" if m.type == "counter" else "")
                for m in Metrics().registry.collect()}
    assert used and used <= exported, used - exported
    assert {"model_boss_gpu_leased_mb", "model_boss_requests_total"} <= used


async def test_more_steps_than_points_are_averaged_in_equal_runs(api):
    client, coord = api
    history = coord.history
    start = time.time() - 100 * history.step_s
    for i in range(100):
        await history.sample(now=start + i * history.step_s)
    history.steps[-1].wait["5"] = 2.0  # one grant's wait, in the last run only
    whole = history.render()
    assert len(whole["t"]) == 100 and whole["step_s"] == history.step_s
    seen = (await client.get("/api/v1/history?points=30", headers=ADMIN)).json()
    assert len(seen["t"]) == 25 and seen["step_s"] == 4 * history.step_s  # runs of 4
    assert seen["t"][0] == pytest.approx(sum(whole["t"][:4]) / 4, abs=0.01)
    assert seen["gpus"]["0"]["capacity_mb"] == 4096 and seen["gpus"]["0"]["name"] == "sim"
    assert seen["gpus"]["0"]["free_mb"] == [whole["gpus"]["0"]["free_mb"][0]] * 25
    assert seen["queue"]["wait_s"]["5"] == [None] * 24 + [2.0]  # nulls ignored in a run
    too_few = await client.get("/api/v1/history?points=3", headers=ADMIN)
    assert too_few.status_code == 400, too_few.text  # never FastAPI's 422
    assert too_few.json()["error"]["param"] == "points", too_few.text
