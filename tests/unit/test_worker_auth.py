"""The Python workers' private key check (``workers.auth.require_key``): without the bearer key
every route answers the worker's refusal; with it the request reaches its route; with no key
set nothing is checked."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from workers.auth import require_key


def _app(key: str | None) -> FastAPI:
    app = FastAPI()
    require_key(app, key, lambda: JSONResponse({"error": "refused"}, status_code=401))

    @app.get("/health")
    async def health() -> dict:
        return {"ok": True}

    @app.post("/echo")
    async def echo(body: dict) -> dict:
        return body

    return app


def test_a_request_without_the_key_is_refused_and_one_with_it_served():
    with TestClient(_app("s3cret")) as client:
        assert client.get("/health").status_code == 401
        assert client.get("/health").json() == {"error": "refused"}
        wrong = client.get("/health", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert client.get("/health", headers={"Authorization": "s3cret"}).status_code == 401
        good = {"Authorization": "Bearer s3cret"}
        assert client.get("/health", headers=good).json() == {"ok": True}
        assert client.post("/echo", json={"a": [1, 2]}, headers=good).json() == {"a": [1, 2]}
        assert client.post("/echo", json={"a": 1}).status_code == 401


def test_no_key_checks_nothing():
    with TestClient(_app(None)) as client:
        assert client.get("/health").json() == {"ok": True}
