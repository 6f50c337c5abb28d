"""Early forwards: the decision (model_boss/services/early_forward.py) as a table over real
catalog, settings and member records, and the member link
(model_boss/backends/http_link.py) against a real uvicorn serving the fake upstream."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from types import SimpleNamespace

import orjson
import pytest
import uvicorn

from model_boss.backends.http_link import HttpLink as MemberLink
from model_boss.backends.upstream import UpstreamTransportError
from model_boss.catalog import Catalog, ModelManifest
from model_boss.cluster import MemberRecord, Route
from model_boss.services.early_forward import early_forward
from model_boss.settings import load_settings
from tests.fake_upstream import make_app

B = MemberRecord("b", "http://b", "0")
CHAT = "/v1/chat/completions"


class WarmOn:
    """The part of Cluster the decision asks: the route its records decide alone."""

    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes = routes

    def warm_route(self, model_id: str, prefix: tuple[int, ...] = ()) -> Route | None:
        return self.routes.get(model_id)


def coordinator(tmp_path, routes: dict[str, Route], **settings):
    manifests = [ModelManifest(id="m", backend="cloud", category="llm", aliases=["em"],
                               base_url="http://up/v1", priority=4),
                 ModelManifest(id="plain", backend="cloud", category="llm",
                               base_url="http://up/v1"),
                 ModelManifest(id="gone", backend="llama-server", category="llm",
                               path="missing.gguf")]
    return SimpleNamespace(cluster=WarmOn(routes), catalog=Catalog(manifests, tmp_path),
                           settings=load_settings(None, **settings))


WARM = {"m": Route(B, "ready on b"), "plain": Route(B, "ready on b"),
        "gone": Route(B, "ready on b"), "here": Route(None, "ready here")}


def body(**fields) -> bytes:
    return orjson.dumps({"messages": [{"role": "user", "content": "hi"}], **fields})


@pytest.mark.parametrize(("raw", "headers", "forwarded"), [
    (body(model="m"), {}, True),
    (body(model="em"), {}, True),  # an alias: sent on as the model it names
    (body(model="m", stream=True), {}, True),  # streams too (passed through, never buffered)
    (b'{"model": "m", "messages": [', {}, False),  # not JSON: the routes answer 400
    (b'["m"]', {}, False),  # not an object
    (body(model=7), {}, False),  # not a name
    (body(), {}, False),  # no model: the default task's business
    (body(model="nobody-knows"), {}, False),  # unknown: the routes answer 404
    (body(model="task:chat"), {}, False),  # a task: its ladder is decided on the full path
    (body(model="m", x_task="chat"), {}, False),
    (body(model="m", x_priority="high"), {}, False),  # a bad extension: the routes' 400
    (body(model="m", x_priority=True), {}, False),
    (body(model="gone"), {}, False),  # unavailable here: the routes say why
    (body(model="cold"), {}, False),  # warm nowhere: the load lock decides
    (body(model="m"), {"x-model-boss-forwarded": "c"}, False),  # one hop at most
    (body(model="m"), {"x-client-id": "walled"}, False),  # limited to some models
])
def test_what_is_forwarded_early(tmp_path, raw, headers, forwarded):
    coord = coordinator(tmp_path, WARM,
                        clients={"walled": {"allowed_models": ["plain"]}})
    early = early_forward(coord, CHAT, raw, headers, None)
    assert (early is not None) is forwarded
    if early is not None:
        assert early.member is B and early.endpoint == CHAT and early.model_id == "m"
        assert early.body["model"] == "m"


def test_ready_here_or_other_paths_are_not_forwarded_early(tmp_path):
    coord = coordinator(tmp_path, {**WARM, "m": Route(None, "ready here")})
    assert early_forward(coord, CHAT, body(model="m"), {}, None) is None
    coord = coordinator(tmp_path, WARM)
    assert early_forward(coord, "/v1/images/generations", body(model="m"), {}, None) is None
    assert early_forward(coord, "/completion", body(model="m"), {}, None) is None  # llama.cpp's
    coord.cluster = None  # not a cluster member
    assert early_forward(coord, CHAT, body(model="m"), {}, None) is None


@pytest.mark.parametrize(("raw", "headers", "settings", "carried"), [
    # the manifest's priority, the anonymous client
    (body(model="m"), {}, {}, {"x_priority": 4, "x_client_id": "anonymous"}),
    # the request's own priority and client (body or headers), budget and keep-alive as asked
    (body(model="m", x_priority=1, x_client_id="me", x_budget_s=9, x_keep_alive_s=60,
          x_thinking=False), {}, {},
     {"x_priority": 1, "x_client_id": "me", "x_budget_s": 9, "x_keep_alive_s": 60,
      "x_thinking": False}),
    (body(model="m"), {"x-priority": "2", "x-client-id": "hdr"}, {},
     {"x_priority": 2, "x_client_id": "hdr"}),
    # the client's profile gives the priority; without a manifest's, the default one
    (body(model="m"), {"x-client-id": "team"}, {"clients": {"team": {"priority": 9}}},
     {"x_priority": 9, "x_client_id": "team"}),
    (body(model="plain"), {}, {"default_priority": 6}, {"x_priority": 6}),
    # unknown x_ fields go on as they came
    (body(model="m", x_trace="t-1"), {}, {}, {"x_trace": "t-1"}),
])
def test_priority_and_client_are_carried(tmp_path, raw, headers, settings, carried):
    early = early_forward(coordinator(tmp_path, WARM, **settings), CHAT, raw, headers,
                          None)
    assert early is not None
    assert early.body["messages"] == [{"role": "user", "content": "hi"}]
    assert {k: early.body.get(k) for k in carried} == carried


# -- the member link, against a real uvicorn -------------------------------------------------


async def until(condition, timeout_s: float) -> None:
    """Wait for ``condition()``, failing after ``timeout_s``."""
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not within {timeout_s} s")


@contextlib.asynccontextmanager
async def linked(timeout_s: float = 5, **config):
    """A real uvicorn serving the fake upstream with ``config``, and a link to it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(make_app(**config), log_level="warning",
                                           lifespan="off", timeout_keep_alive=1))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    link = MemberLink(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", timeout_s=timeout_s)
    try:
        await until(lambda: server.started, 10)
        yield link, server
    finally:
        await link.close()
        server.should_exit = True
        await task


HEADERS = {"content-type": "application/json"}


async def test_the_link_posts_and_keeps_the_connection():
    async with linked() as (link, server):
        seen = []
        for word in ("one", "two", "three"):
            reply = await link.post("/chat/completions", body(model="m", messages=[
                {"role": "user", "content": word}]), HEADERS, stream=False)
            assert reply.status == 200 and reply.content_type == "application/json"
            assert orjson.loads(reply.body)["choices"][0]["message"]["content"] == \
                f"echo: {word}"
            seen.append(set(server.server_state.connections))
        assert len(seen[0]) == 1 and seen[0] == seen[1] == seen[2]  # one keep-alive connection
        missing = await link.post("/nowhere", b"{}", HEADERS, stream=False)
        assert missing.status == 404 and orjson.loads(missing.body)["error"]["code"] == \
            "not_found"


async def test_the_link_streams_chunk_by_chunk():
    async with linked(chunks=3, chunk_delay_ms=50) as (link, server):
        reply = await link.post("/chat/completions", body(model="m", stream=True),
                                HEADERS, stream=True)
        assert reply.status == 200 and reply.content_type == "text/event-stream"
        assert reply.chunks is not None
        first = await anext(reply.chunks)  # before the rest was sent
        assert first.startswith(b"data: ") and b"part0" in first
        rest = b"".join([chunk async for chunk in reply.chunks])
        assert b"part2" in rest and rest.endswith(b"data: [DONE]\n\n")
        used = set(server.server_state.connections)
        again = await link.post("/chat/completions", body(model="m"), HEADERS, False)
        assert again.status == 200
        assert set(server.server_state.connections) == used  # the connection went back


async def test_a_stream_dropped_by_its_reader_closes_the_connection():
    async with linked(chunks=3, chunk_delay_ms=300) as (link, server):
        reply = await link.post("/chat/completions", body(model="m", stream=True),
                                HEADERS, stream=True)
        assert b"part0" in await anext(reply.chunks)  # type: ignore[arg-type]
        await reply.chunks.aclose()  # type: ignore[union-attr]
        # the member sees its client go (and stops), long before the stream would end
        await until(lambda: not server.server_state.connections, 0.5)


async def test_a_connection_the_member_closed_is_not_reused():
    async with linked() as (link, server):
        assert (await link.post("/chat/completions", body(model="m"), HEADERS,
                                False)).status == 200
        # uvicorn drops the idle connection after 1 s
        await until(lambda: not server.server_state.connections, 5)
        assert (await link.post("/chat/completions", body(model="m"), HEADERS,
                                False)).status == 200


async def test_a_member_lost_mid_stream_or_unreachable_is_a_transport_error():
    async with linked(chunks=4, break_after=2) as (link, _):
        reply = await link.post("/chat/completions", body(model="m", stream=True),
                                HEADERS, stream=True)
        got = []
        with pytest.raises(UpstreamTransportError):
            async for chunk in reply.chunks:  # type: ignore[union-attr]
                got.append(chunk)
        assert b"part1" in b"".join(got)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    with pytest.raises(UpstreamTransportError):
        await MemberLink(f"http://127.0.0.1:{port}", timeout_s=5).post(
            "/v1/chat/completions", b"{}", HEADERS, False)


async def test_a_silent_member_times_out():
    async with linked(timeout_s=0.3, chunks=2, chunk_delay_ms=2000) as (link, _):
        reply = await link.post("/chat/completions", body(model="m", stream=True),
                                HEADERS, stream=True)
        with pytest.raises(UpstreamTransportError, match="no answer"):
            await anext(reply.chunks)  # type: ignore[arg-type]


def test_a_link_needs_plain_http():
    with pytest.raises(ValueError):
        MemberLink("https://b:8210", timeout_s=1)
