"""GET /api/v1/usage: JSON and CSV answers, who sees which rows, OpenAI-shaped 400s."""

from __future__ import annotations

import csv
import io
import time
from datetime import UTC, datetime
from types import SimpleNamespace

import httpx
import pytest
from fastapi import FastAPI

from model_boss.api.errors import install_error_handlers
from model_boss.api.tenants.usage import router
from model_boss.tenancy.keys.identity import Identity, with_identity
from model_boss.tenancy.usage import SUMMED, UsageLedger, UsageRow

DAY = datetime(2025, 5, 10, tzinfo=UTC).timestamp()


def row(key: str, model: str, at: float, **figures) -> UsageRow:
    return UsageRow(key=key, end_user="", model=model, endpoint="chat", outcome="ok",
                    http_status=200, at=at, **figures)


class AsIdentity:
    """The edge as the test says: ``x-test-key: NAME`` (``NAME!`` for an admin)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        given = dict(scope.get("headers") or []).get(b"x-test-key")
        if scope["type"] == "http" and given is not None:
            name = given.decode()
            scope = with_identity(scope, Identity(key=name.rstrip("!"),
                                                  admin=name.endswith("!")))
        await self.app(scope, receive, send)


@pytest.fixture
async def client():
    ledger = UsageLedger(None)
    await ledger.start()
    ledger.record(row("team-a", "m1", DAY + 3600, prompt_tokens=10, completion_tokens=5,
                      gpu_seconds=1.25))
    ledger.record(row("team-a", "m1", DAY + 7200, prompt_tokens=1, gpu_seconds=0.5))
    ledger.record(row("team-a", "m2", DAY + 7200, images=2))
    ledger.record(row("team-b", "m1", DAY + 86400 + 60, prompt_tokens=100))  # the next day
    ledger.record(row("team-b", "m1", time.time(), completion_tokens=3))  # today
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(router)
    app.state.coordinator = SimpleNamespace(usage=ledger, usage_report=ledger.query)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=AsIdentity(app)),
                                 base_url="http://mb") as http:
        yield http
    await ledger.stop()


async def test_json_groups_and_sums_over_the_period(client: httpx.AsyncClient) -> None:
    answer = await client.get("/api/v1/usage", params={
        "group_by": "key,model", "from": "2025-05-10", "to": "2025-05-11T23:59:59Z"})
    assert answer.status_code == 200
    body = answer.json()
    assert body["from"] == "2025-05-10T00:00:00Z" and body["to"] == "2025-05-11T23:59:59Z"
    assert body["group_by"] == ["key", "model"]
    rows = body["rows"]
    assert [(r["key"], r["model"], r["requests"]) for r in rows] == [
        ("team-a", "m1", 2), ("team-a", "m2", 1), ("team-b", "m1", 1)]
    assert rows[0]["prompt_tokens"] == 11 and rows[0]["gpu_seconds"] == 1.75
    assert rows[1]["images"] == 2
    assert set(rows[0]) == {"key", "model", "requests", *SUMMED}


async def test_the_default_period_is_today(client: httpx.AsyncClient) -> None:
    rows = (await client.get("/api/v1/usage")).json()["rows"]
    assert [(r["key"], r["completion_tokens"]) for r in rows] == [("team-b", 3)]


async def test_a_bare_to_date_takes_in_that_day(client: httpx.AsyncClient) -> None:
    body = (await client.get("/api/v1/usage", params={
        "group_by": "day", "from": "2025-05-10", "to": "2025-05-10"})).json()
    assert body["to"] == "2025-05-11T00:00:00Z"
    assert [(r["day"], r["requests"]) for r in body["rows"]] == [("2025-05-10", 3)]


async def test_filters_by_model(client: httpx.AsyncClient) -> None:
    rows = (await client.get("/api/v1/usage", params={
        "group_by": "", "from": "2025-01-01", "model": "m2"})).json()["rows"]
    assert [(r["requests"], r["images"]) for r in rows] == [(1, 2)]


async def test_csv(client: httpx.AsyncClient) -> None:
    answer = await client.get("/api/v1/usage", params={
        "group_by": "key", "from": "2025-05-10", "to": "2025-05-10", "format": "csv"})
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/csv")
    table = list(csv.reader(io.StringIO(answer.text)))
    assert table[0] == ["key", "requests", *SUMMED]
    assert table[1][:3] == ["team-a", "3", "11"]
    assert len(table) == 2


async def test_csv_of_nothing_is_its_header(client: httpx.AsyncClient) -> None:
    answer = await client.get("/api/v1/usage", params={
        "group_by": "model", "from": "2020-01-01", "to": "2020-01-02", "format": "csv"})
    assert answer.text.strip() == ",".join(["model", "requests", *SUMMED])


async def test_a_user_key_sees_only_its_own_rows(client: httpx.AsyncClient) -> None:
    params = {"group_by": "key", "from": "2025-01-01", "key": "team-a"}
    rows = (await client.get("/api/v1/usage", params=params,
                             headers={"x-test-key": "team-b"})).json()["rows"]
    assert [r["key"] for r in rows] == ["team-b"]
    admin = (await client.get("/api/v1/usage", params={**params, "key": ""},
                              headers={"x-test-key": "boss!"})).json()["rows"]
    assert [r["key"] for r in admin] == ["team-a", "team-b"]
    nobody = (await client.get("/api/v1/usage", params={**params, "key": ""},
                               headers={"x-test-key": "nobody"})).json()["rows"]
    assert nobody == []


@pytest.mark.parametrize(("params", "param"), [
    ({"from": "yesterday"}, "from"),
    ({"to": "2025-13-01"}, "to"),
    ({"from": "2025-05-02", "to": "2025-05-01T00:00:00"}, "from"),
    ({"group_by": "key,colour"}, "group_by"),
    ({"format": "xml"}, "format"),
])
async def test_a_bad_parameter_is_a_400_naming_it(client: httpx.AsyncClient, params,
                                                  param) -> None:
    answer = await client.get("/api/v1/usage", params=params)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(param)
