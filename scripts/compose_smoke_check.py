#!/usr/bin/env python3
"""Checks a running docker-compose.cluster.yml from the host (scripts/compose_smoke.sh runs
it between `up -d` and `down`): both members register and are healthy, the demo model
answers on member-a, member-b forwards to member-a (plain and streaming), a forged forward is
refused, the members come back after a Redis restart, and a member that is killed (SIGKILL)
or stopped (SIGTERM) leaves the cluster.
Standard library only, so it runs with any python3 on the host. Exits 1 at the first failed
check.

Usage: compose_smoke_check.py --compose "docker-compose -p NAME -f docker-compose.cluster.yml"
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
MODEL = "smollm2-135m"
MEMBERS = {"member-a", "member-b"}


class CheckFailed(Exception):
    """A check did not hold; the message says what was seen."""


class Reply:
    """Status, headers and body of one HTTP answer."""

    def __init__(self, status: int, headers: Any, body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def member(self) -> str | None:
        return self.headers.get("x-model-boss-member")


def call(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None,
         timeout_s: float = 10.0) -> Reply:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return Reply(resp.status, resp.headers, resp.read())
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, exc.headers, exc.read())


def wait_for(what: str, probe: Callable[[], T | None], deadline_s: float,
             interval_s: float = 0.5) -> T:
    """Call ``probe`` until it returns something other than None (errors count as not yet)."""
    deadline = time.monotonic() + deadline_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = probe()
        except (OSError, ValueError) as exc:  # not up yet, connection reset, bad JSON
            value, last = None, exc
        if value is not None:
            return value
        time.sleep(interval_s)
    raise CheckFailed(f"{what}: not within {deadline_s:.0f} s (last error: {last!r})")


def members(url: str) -> set[str]:
    view = call("GET", f"{url}/api/v1/cluster").json()
    if not view.get("enabled"):
        raise CheckFailed(f"{url}: cluster mode is off: {view}")
    return {m["host_id"] for m in view["members"]}


def model_places(url: str) -> dict[str, str]:
    """Where the demo model is, as this member sees it: {host_id: state}."""
    view = call("GET", f"{url}/api/v1/cluster").json()
    return {p["host_id"]: p["state"] for p in view["models"].get(MODEL, [])}


def chat(url: str, prompt: str, stream: bool = False) -> Reply:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 16, "temperature": 0, "stream": stream}
    return call("POST", f"{url}/v1/chat/completions", body, timeout_s=300)


def expect(ok: bool, message: str) -> None:
    if not ok:
        raise CheckFailed(message)


def passed(message: str) -> None:
    print(f"PASS {message}", flush=True)


def check_registered(a: str, b: str) -> None:
    for name, url in (("member-a", a), ("member-b", b)):
        wait_for(f"{name} /health", lambda u=url: call("GET", f"{u}/health").status == 200
                 or None, 300)
    for url in (a, b):
        seen = wait_for(f"{url} lists both members",
                        lambda u=url: members(u) if members(u) == MEMBERS else None, 30)
        passed(f"GET {url}/api/v1/cluster lists {sorted(seen)}")


def container_health(compose: list[str], service: str) -> str:
    """Docker's health status of a service's container (the image's HEALTHCHECK)."""
    ids = subprocess.run([*compose, "ps", "-q", service], check=True, capture_output=True,
                         text=True).stdout.split()
    expect(len(ids) == 1, f"{service}: containers {ids}")
    return subprocess.run(["docker", "inspect", "-f", "{{.State.Health.Status}}", ids[0]],
                          check=True, capture_output=True, text=True).stdout.strip()


def check_healthy(compose: list[str]) -> None:
    for service in ("redis", "member-a", "member-b"):
        wait_for(f"{service} healthy",
                 lambda s=service: container_health(compose, s) == "healthy" or None, 120, 2)
    passed("docker reports redis, member-a and member-b healthy")


def check_chat_on_a(a: str) -> None:
    started = time.monotonic()
    reply = chat(a, "Say hello.")
    expect(reply.status == 200, f"chat on member-a: {reply.status} {reply.body[:300]!r}")
    text = reply.json()["choices"][0]["message"]["content"]
    expect(isinstance(text, str) and text.strip() != "", f"empty answer: {reply.json()}")
    expect(reply.member == "member-a", f"served by {reply.member}, expected member-a")
    passed(f"chat on member-a (cold load included: {time.monotonic() - started:.1f} s), "
           f"X-Model-Boss-Member: {reply.member}, answer {text.strip()[:40]!r}")


def check_forward(a: str, b: str) -> None:
    for url in (a, b):
        places = wait_for(f"{url} sees {MODEL} ready on member-a",
                          lambda u=url: model_places(u) if model_places(u).get("member-a")
                          == "ready" else None, 15)
        passed(f"{url}/api/v1/cluster: {MODEL} at {places}")
    reply = chat(b, "Name a colour.")
    expect(reply.status == 200, f"chat sent to member-b: {reply.status} {reply.body[:300]!r}")
    expect(reply.member == "member-a",
           f"chat sent to member-b was served by {reply.member}, expected member-a")
    passed(f"chat sent to member-b answered by {reply.member} (forwarded)")
    reply = chat(b, "Count to five.", stream=True)
    events = [line[6:] for line in reply.body.decode().splitlines() if line.startswith("data: ")]
    expect(reply.status == 200 and reply.member == "member-a",
           f"stream sent to member-b: {reply.status}, member {reply.member}")
    expect(len(events) >= 3 and events[-1] == "[DONE]",
           f"stream through member-b: {len(events)} data lines, last {events[-1:]}")
    content = "".join(json.loads(e)["choices"][0]["delta"].get("content") or ""
                      for e in events[:-1])
    passed(f"stream sent to member-b answered by {reply.member}: {len(events) - 1} chunks "
           f"then [DONE], text {content.strip()[:40]!r}")
    places = model_places(b)
    expect("member-b" not in places, f"{MODEL} was loaded on member-b too: {places}")
    passed(f"{MODEL} still only on member-a: {places}")


def check_forged_forward(b: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for headers in ({"x-model-boss-forwarded": "member-a"},
                    {"x-model-boss-forwarded": "member-a",
                     "x-model-boss-cluster-secret": "not-the-secret"}):
        reply = call("POST", f"{b}/v1/chat/completions", body, headers)
        code = reply.json().get("error", {}).get("code")
        expect(reply.status == 403 and code == "forward_refused",
               f"forged forward {sorted(headers)}: {reply.status} {reply.body[:200]!r}")
    passed("forged forwards (no secret, wrong secret) refused: 403 forward_refused")


def beats_since(url: str, since: float) -> dict[str, float] | None:
    """Both members' records as ``url`` reads them from Redis, when each was written after
    ``since`` (wall clock: the containers share the host's); else None."""
    view = call("GET", f"{url}/api/v1/cluster").json()
    written = {m["host_id"]: m["updated_at"] for m in view["members"]}
    if set(written) != MEMBERS or min(written.values()) <= since:
        return None
    return written


def check_redis_restart(a: str, b: str, compose: list[str]) -> None:
    started = time.monotonic()
    subprocess.run([*compose, "restart", "redis"], check=True, capture_output=True)
    restarted, restarted_at = time.monotonic(), time.time()
    for url in (a, b):
        wait_for(f"{url} reads both members' records written after the Redis restart",
                 lambda u=url: beats_since(u, restarted_at), 30)
        wait_for(f"{url} sees {MODEL} on member-a after the Redis restart",
                 lambda u=url: model_places(u).get("member-a") == "ready" or None, 30)
    back = time.monotonic() - restarted
    reply = chat(b, "Say no.")
    expect(reply.status == 200 and reply.member == "member-a",
           f"chat sent to member-b after the Redis restart: {reply.status} {reply.member}")
    passed(f"Redis restarted ({restarted - started:.1f} s): both members wrote their records "
           f"again and {MODEL} is listed on member-a {back:.1f} s later; member-b forwards to "
           "member-a again")


def time_until_gone(a: str, command: list[str], deadline_s: float) -> float:
    """Run ``command`` (a compose kill or stop) while watching member-a's view; the seconds
    from the command's start until member-b is no longer listed."""
    started = time.monotonic()
    done = threading.Event()
    failure: list[str] = []

    def run() -> None:
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            failure.append(f"{shlex.join(command)}: {result.stderr.strip()}")
        done.set()

    threading.Thread(target=run, daemon=True).start()
    wait_for("member-a drops member-b", lambda: "member-b" not in members(a) or None,
             deadline_s, interval_s=0.2)
    gone = time.monotonic() - started
    done.wait(60)
    expect(not failure, "; ".join(failure))
    return gone


def check_member_leaves(a: str, b: str, compose: list[str], ttl_s: float,
                        beat_s: float) -> None:
    gone = time_until_gone(a, [*compose, "kill", "-s", "SIGKILL", "member-b"],
                           ttl_s + 2 * beat_s + 5)
    expect(members(a) == {"member-a"}, f"after the kill member-a sees {members(a)}")
    passed(f"member-b SIGKILLed: dropped from member-a's view after {gone:.1f} s "
           f"(record TTL {ttl_s:g} s, heartbeat {beat_s:g} s)")
    reply = chat(a, "Say yes.")
    expect(reply.status == 200 and reply.member == "member-a",
           f"chat on member-a with member-b gone: {reply.status} {reply.member}")
    passed("member-a still answers with member-b gone")
    subprocess.run([*compose, "start", "member-b"], check=True, capture_output=True)
    wait_for("member-b back in the cluster", lambda: members(a) == MEMBERS or None, 300)
    passed("member-b started again: both members listed")
    gone = time_until_gone(a, [*compose, "stop", "member-b"], ttl_s + 2 * beat_s + 30)
    passed(f"member-b stopped (SIGTERM): dropped from member-a's view after {gone:.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compose", required=True, help="the compose command, as one string")
    parser.add_argument("--a", default="http://127.0.0.1:8210", help="member-a from the host")
    parser.add_argument("--b", default="http://127.0.0.1:8211", help="member-b from the host")
    parser.add_argument("--ttl-s", type=float, default=6.0, help="cluster_member_ttl_s")
    parser.add_argument("--beat-s", type=float, default=2.0, help="cluster_heartbeat_s")
    args = parser.parse_args()
    compose = shlex.split(args.compose)
    try:
        check_registered(args.a, args.b)
        check_healthy(compose)
        check_chat_on_a(args.a)
        check_forward(args.a, args.b)
        check_forged_forward(args.b)
        check_redis_restart(args.a, args.b, compose)
        check_member_leaves(args.a, args.b, compose, args.ttl_s, args.beat_s)
    except CheckFailed as exc:
        print(f"FAIL {exc}", flush=True)
        return 1
    print("all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
