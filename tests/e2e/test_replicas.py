"""Replicas on real llama.cpp workers, two declared GPUs on one host: a burst starts a second
replica on the other GPU, which goes when idle; a conversation's turns stay on one replica and
find their prefix cached there; a replica killed mid-stream ends its stream with an error
event and the next turn goes to the survivor; and the promise holds on every snapshot of a
stress run with replicas on."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import threading
import time

import httpx
import pytest

from tests.conftest import llama_manifest, wait_for
from tests.e2e.test_stress import MARGIN_MB, send, violations_in

pytestmark = pytest.mark.slow

TWO_GPUS = [{"index": 0, "vram_mb": 2048}, {"index": 1, "vram_mb": 2048}]
REPLICA = "x-model-boss-replica"
CACHED = "x-model-boss-cached-prefix-tokens"


def replicated(demo_gguf, **extra) -> dict:
    return llama_manifest("smol", demo_gguf, **{"vram_mb": 800, "parallel": 1,
                                                "replicas": {"min": 1, "max": 2}, **extra})


def slots_by_key(server) -> dict[str, dict]:
    return {s["key"]: s for s in server.status()["slots"]}


def chat(server, messages: list[dict], session: str | None = None,
         max_tokens: int = 8) -> httpx.Response:
    headers = {"X-Session-Id": session} if session else {}
    answer = httpx.post(server.url + "/v1/chat/completions", headers=headers, timeout=120,
                        json={"model": "smol", "max_tokens": max_tokens, "temperature": 0,
                              "messages": messages})
    assert answer.status_code == 200, answer.text
    return answer


def burst(server, n: int, max_tokens: int = 48) -> list[httpx.Response]:
    answers: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda i=i: answers.append(chat(
        server, [{"role": "user", "content": f"Count to {i + 20}."}], max_tokens=max_tokens)))
        for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def test_a_burst_starts_a_second_replica_on_the_other_gpu_which_goes_when_idle(
        make_server, demo_gguf):
    server = make_server({"gpus": TWO_GPUS, "replica_scale_wait_s": 0.3,
                          "reaper_interval_s": 0.5},
                         [replicated(demo_gguf, stay_warm_s=4)])
    answers = burst(server, 6)
    served_by = {a.headers[REPLICA] for a in answers}
    assert served_by == {"smol", "smol#2"}, served_by  # both copies answered the burst
    slots = slots_by_key(server)
    gpus = {key: set(slot["lease"]["allocations"]) for key, slot in slots.items()
            if slot["lease"]}
    assert gpus == {"smol": {"0"}, "smol#2": {"1"}} or gpus == {"smol": {"1"},
                                                               "smol#2": {"0"}}, gpus
    events = httpx.get(server.url + "/api/v1/events?stream=false").json()["events"]
    added = [e for e in events if e["type"] == "replica_added"]
    assert len(added) == 1 and added[0]["replica"] == "smol#2", added
    assert added[0]["waited_s"] >= 0.3
    # idle: every copy goes by its keep-alive, the second one's slot and lease with it
    wait_for(lambda: "smol#2" not in slots_by_key(server), timeout=30,
             what=lambda: slots_by_key(server))
    wait_for(lambda: not server.status()["leases"], timeout=30,
             what=lambda: server.status()["leases"])
    # and no worker process of either copy is left (llama models only: no spare worker)
    wait_for(lambda: not server.worker_pids(), timeout=15, what=server.worker_pids)
    assert not any(s["pid"] for s in server.status()["slots"])
    # the next burst starts one again (the first copy's cold load is waited out first)
    again = burst(server, 6)
    assert {a.headers[REPLICA] for a in again} == {"smol", "smol#2"}


SYSTEMS = [f"You are assistant number {n}. " + " ".join(
    f"Rule {n}.{i}: answer briefly and politely." for i in range(18)) for n in range(4)]


def test_turns_stay_on_their_replica_cached_and_each_copy_bills_its_own_time(
        make_server, demo_gguf):
    server = make_server({"gpus": TWO_GPUS, "replica_scale_wait_s": 0.2},
                         [replicated(demo_gguf, replicas={"min": 2, "max": 2})])
    burst(server, 2, max_tokens=4)  # min 2: both start as soon as the model is wanted
    wait_for(lambda: all(s["state"] == "ready" for s in slots_by_key(server).values())
             and len(slots_by_key(server)) == 2, timeout=60, what=lambda: slots_by_key(server))
    conversations = [[{"role": "system", "content": system}] for system in SYSTEMS]
    where: dict[int, list[str]] = {n: [] for n in range(len(SYSTEMS))}
    cached: dict[int, list[int]] = {n: [] for n in range(len(SYSTEMS))}
    for turn in range(3):
        for n, messages in enumerate(conversations):  # interleaved, no session named
            messages.append({"role": "user", "content": f"Question {turn}: what is {turn}+{n}?"})
            answer = chat(server, messages)
            messages.append(answer.json()["choices"][0]["message"])
            where[n].append(answer.headers[REPLICA])
            cached[n].append(int(answer.headers[CACHED]))
    for n in where:
        assert len(set(where[n])) == 1, where  # every turn on the replica of the first
        assert cached[n][0] == 0 and all(c > 0 for c in cached[n][1:]), cached
    assert {w[0] for w in where.values()} == {"smol", "smol#2"}, where  # both used
    rows = httpx.get(server.url + "/api/v1/requests?limit=50").json()
    rows = rows.get("requests", rows) if isinstance(rows, dict) else rows
    routed = [row for row in rows if row.get("replica")]
    assert routed and {row["route"] for row in routed} >= {"cached prefix"}, routed[:3]
    # the bill of the same run: the turns alternated between the two warm copies, and two
    # bursts keep both busy at once; each copy has its own busy clock and load mark, so the
    # GPU-seconds less loads add up to the requests' own time (one at a time on each copy),
    # and each copy's one load is charged once (per model, two copies at once were charged
    # half their time each, and an alternating request the other copy's load again)
    burst(server, 2, max_tokens=24)
    burst(server, 2, max_tokens=24)
    sent = 2 + 3 * len(SYSTEMS) + 4
    billed = wait_for(lambda: next((row for row in httpx.get(
        server.url + "/api/v1/usage", params={"group_by": "model"}).json()["rows"]
        if row["requests"] == sent), None), timeout=20)
    busy = billed["gpu_seconds"] - billed["load_seconds"]
    assert busy == pytest.approx(billed["duration_s"], rel=0.05), billed
    loads = [slot["last_load_s"] for slot in slots_by_key(server).values()]
    assert len(loads) == 2 and billed["load_seconds"] == pytest.approx(sum(loads), abs=0.01), \
        (billed, loads)


def test_a_replica_killed_mid_stream_errors_and_the_next_turn_goes_to_the_survivor(
        make_server, demo_gguf):
    server = make_server({"gpus": TWO_GPUS},
                         [replicated(demo_gguf, replicas={"min": 2, "max": 2})])
    burst(server, 2, max_tokens=4)
    wait_for(lambda: len([s for s in slots_by_key(server).values() if s["state"] == "ready"])
             == 2, timeout=60, what=lambda: slots_by_key(server))
    session = "conversation-1"
    first = chat(server, [{"role": "user", "content": "Hello"}], session=session)
    victim = first.headers[REPLICA]
    pid = slots_by_key(server)[victim]["pid"]
    body = {"model": "smol", "stream": True, "max_tokens": 400, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Write a very long story."}]}
    events: list[str] = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"X-Session-Id": session}) as response:
        assert response.headers[REPLICA] == victim  # the session keeps to its replica
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 3:
                    threading.Thread(target=os.kill, args=(pid, signal.SIGKILL)).start()
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "worker_failed"
    survivor = ({"smol", "smol#2"} - {victim}).pop()
    after = chat(server, [{"role": "user", "content": "Hello again"}], session=session)
    assert after.headers[REPLICA] == survivor
    wait_for(lambda: slots_by_key(server).get(survivor, {}).get("active_requests") == 0,
             timeout=10)


STRESS_S = 12.0


@pytest.mark.timeout(STRESS_S + 200)
def test_the_promise_holds_with_replicas_on(make_server, demo_gguf):
    server = make_server(
        {"gpus": TWO_GPUS, "vram_margin_mb": MARGIN_MB, "reaper_interval_s": 0.5,
         "replica_scale_wait_s": 0.2, "max_queue_wait_s": 120},
        [replicated(demo_gguf, vram_mb=700, replicas={"min": 1, "max": 2}),
         llama_manifest("b", demo_gguf, vram_mb=700, parallel=1)])
    deadline = time.monotonic() + STRESS_S
    outcomes: dict[str, int] = {}
    bad: list[str] = []
    snapshots = 0
    copies: set[str] = set()

    def body(rng: random.Random) -> dict:
        return {"model": rng.choice(["smol", "smol", "smol", "b"]), "max_tokens": 6,
                "stream": rng.random() < 0.5, "x_keep_alive_s": rng.choice([0, 1, 3]),
                "x_priority": rng.choice([0, 5, 9]),
                "messages": [{"role": "system", "content": SYSTEMS[rng.randrange(4)]},
                             {"role": "user", "content": "hi"}]}

    async def client_loop(client: httpx.AsyncClient, seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            await send(client, "/v1/chat/completions", body(rng), outcomes, bad)

    async def watcher(client: httpx.AsyncClient) -> None:
        nonlocal snapshots
        while time.monotonic() < deadline:
            status = (await client.get("/api/v1/status")).json()
            snapshots += 1
            bad.extend(f"snapshot {snapshots}: {p}" for p in violations_in(status))
            held: dict[tuple[str, str], str] = {}
            for slot in status["slots"]:
                copies.add(slot["key"])
                for gpu in (slot["lease"] or {}).get("allocations", {}):
                    if (slot["model"], gpu) in held:  # two copies of a model on one GPU
                        bad.append(f"snapshot {snapshots}: {slot['key']} and "
                                   f"{held[slot['model'], gpu]} share GPU {gpu}")
                    held[slot["model"], gpu] = slot["key"]
            await asyncio.sleep(0.01)

    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=180,
                                     limits=httpx.Limits(max_connections=32)) as client:
            await asyncio.gather(watcher(client), *[client_loop(client, s) for s in range(6)])

    asyncio.run(main())
    assert not bad, (f"{len(bad)} problem(s) in {snapshots} snapshots beside {outcomes}: "
                     f"{bad[:10]}")
    assert snapshots > STRESS_S * 5 and "smol#2" in copies, (snapshots, copies)
    assert set(outcomes) == {"chat", "chat streamed"}, outcomes
    assert sum(outcomes.values()) >= STRESS_S / 6, outcomes  # loads and swaps, one core each
    wait_for(lambda: server.status()["queue"]["depth"] == 0 and all(
        s["active_requests"] == 0 for s in server.status()["slots"]), timeout=60)
    assert not violations_in(server.status())
    print(f"\nreplicas stress: {snapshots} snapshots, outcomes {outcomes}, copies {copies}")
