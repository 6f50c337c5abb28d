"""DirectRoutes (model_boss/api/middleware/direct_routes.py): a queued POST with a JSON body its
model accepts reaches the route's function without FastAPI's router; every other request, and
every body that does not parse or validate, goes through FastAPI, so the answers are the
same either way, word for word."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel

from model_boss.api.app import create_app
from model_boss.api.middleware.direct_routes import DirectRoutes, direct_route
from model_boss.backends.base import UpstreamResponse

from .fakes import FakeBackend, coordinator, manifest

ANSWER = orjson.dumps({"choices": [{"message": {"role": "assistant", "content": "yo"},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 1}})


class Body(BaseModel):
    text: str


router = APIRouter()


@router.post("/taken")
async def taken(request: Request, body: Body) -> Response:
    return Response(body.text)


@router.post("/with/{part}")
async def with_path_parameter(request: Request, part: str, body: Body) -> Response:
    return Response(part)


@router.post("/depends", dependencies=[Depends(lambda: None)])
async def with_dependency(request: Request, body: Body) -> Response:
    return Response(body.text)


@router.post("/plain")
async def returns_a_dict(request: Request, body: Body) -> dict:
    return {}


@router.get("/read")
async def a_get(request: Request) -> Response:
    return Response()


@pytest.mark.parametrize(("path", "taken_directly"), [
    ("/taken", True),  # (Request, Model) -> Response, no dependencies
    ("/with/{part}", False),  # a path parameter
    ("/depends", False),  # a dependency of the route
    ("/plain", False),  # FastAPI serialises its answer
    ("/read", False),  # not a POST
])
def test_which_routes_are_taken_directly(path, taken_directly):
    route = next(r for r in router.routes if r.path == path)  # type: ignore[attr-defined]
    assert (direct_route(route) is not None) == taken_directly
    assert (path in DirectRoutes(None, router.routes).table) == taken_directly


@pytest.fixture
async def apps(tmp_path, monkeypatch):
    """The app as built, its direct layer spied on (what it passes on to FastAPI's router),
    and the same app with no direct routes, over one coordinator."""
    async def chat(self, endpoint, body, stream):
        return UpstreamResponse(200, {"content-type": "application/json"}, body=ANSWER)

    monkeypatch.setattr(FakeBackend, "handle_request", chat)
    coord, _ = coordinator(tmp_path, [manifest("a", 1000)])
    direct = create_app(coordinator=coord)
    plain = create_app(coordinator=coord)
    del plain.build_middleware_stack  # FastAPI's own: every request through its router
    passed_on: list[str] = []
    stack = direct.build_middleware_stack()
    layer: Any = stack
    while not isinstance(layer, DirectRoutes):
        layer = layer.app
    router_app = layer.app

    async def spy(scope, receive, send):
        passed_on.append(scope["path"])
        await router_app(scope, receive, send)

    layer.app = spy
    direct.middleware_stack = stack
    await coord.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=direct),
                                     base_url="http://127.0.0.1") as a, \
                httpx.AsyncClient(transport=httpx.ASGITransport(app=plain),
                                  base_url="http://127.0.0.1") as b:
            yield a, b, passed_on
    finally:
        await coord.stop()


def same(content: bytes) -> Any:
    """An answer less what differs between any two answers (ids, clocks, durations)."""
    try:
        value = orjson.loads(content)
    except orjson.JSONDecodeError:
        return content
    if isinstance(value, dict):
        return {k: v for k, v in value.items()
                if k not in ("id", "created", "created_at") and not k.endswith("_duration")}
    return value


CHAT = {"model": "a", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(("name", "content", "headers", "direct"), [
    ("a valid chat", orjson.dumps(CHAT), JSON, True),
    ("with a charset", orjson.dumps(CHAT), {"content-type": "application/json; charset=utf-8"},
     True),
    ("an unknown model (the route's own 404)", orjson.dumps({**CHAT, "model": "nope"}), JSON,
     True),
    ("not JSON", b"{\"model\": ", JSON, False),
    ("a field of the wrong type", orjson.dumps({**CHAT, "messages": "hi"}), JSON, False),
    ("no messages (Ollama's chat loads the model)", orjson.dumps({"model": "a"}), JSON,
     {"/api/chat": True}),
    ("an empty body", b"", JSON, False),
    ("JSON's NaN (Python's parser takes it)", b'{"model": "a", "temperature": NaN, '
     b'"messages": [{"role": "user", "content": "hi"}]}', JSON, False),
    ("a text body (Ollama's routes read any body as JSON)", orjson.dumps(CHAT),
     {"content-type": "text/plain"}, {"/api/chat": True}),
    ("curl's form type on JSON", orjson.dumps(CHAT),
     {"content-type": "application/x-www-form-urlencoded"}, True),
])
async def test_answers_are_the_same_either_way(apps, name, content, headers, direct):
    with_direct, without, passed_on = apps
    for path in ("/v1/chat/completions", "/v1/messages", "/api/chat"):
        body = content
        if path != "/v1/chat/completions" and content and b"NaN" not in content \
                and content != b"{\"model\": ":
            body = orjson.dumps({**orjson.loads(content), "stream": False})
        a = await with_direct.post(path, content=body, headers=headers)
        b = await without.post(path, content=body, headers=headers)
        assert (a.status_code, same(a.content)) == (b.status_code, same(b.content)), (name, path)
        expected = direct.get(path, False) if isinstance(direct, dict) else direct
        assert (path not in passed_on) == expected, (name, path, a.status_code)
        passed_on.clear()


async def test_other_routes_go_to_fastapi(apps):
    with_direct, _, passed_on = apps
    assert (await with_direct.get("/v1/models")).status_code == 200
    assert (await with_direct.post("/api/v1/models/a/load")).status_code in (200, 202)
    assert passed_on == ["/v1/models", "/api/v1/models/a/load"]
