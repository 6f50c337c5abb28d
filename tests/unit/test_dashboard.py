"""The dashboard's files at /ui (served without a key, only the files named) and the status
document's per-manifest view the page reads."""

from __future__ import annotations

import re

import pytest

from model_boss.api.dashboard import FILES

from .fakes import coordinator, manifest, started_client

ADMIN = {"authorization": "Bearer admin-key"}


@pytest.fixture
async def api(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("a", 1000, aliases=["alias-a"], parallel=2),
                                      manifest("b", 2000, pin=True)],
                           api_key="user-key", admin_api_key="admin-key")
    async with started_client(coord) as client:
        yield client, coord


async def test_page_and_its_files_need_no_key(api):
    client, _ = api
    root = await client.get("/ui")
    assert root.status_code == 307 and root.headers["location"] == "/ui/"
    page = await client.get("/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    for name, media_type in FILES.items():
        served = await client.get(f"/ui/{name}")
        assert served.status_code == 200 and served.headers["content-type"] == media_type
    assert (await client.get("/api/v1/status")).status_code == 401  # the API still asks


async def test_only_the_named_files_are_served(api):
    client, _ = api
    for path in ("/ui/nothing.js", "/ui/..%2Fapi%2Fapp.py", "/ui/__init__.py"):
        missing = await client.get(path)
        assert missing.status_code == 404, path
        assert missing.json()["error"]["code"] == "not_found"


async def test_page_loads_nothing_from_elsewhere(api):
    client, _ = api
    html = (await client.get("/ui/")).text
    linked = re.findall(r'(?:src|href)="([^"#]+)"', html)
    assert linked and all(link.startswith("/ui/") and link[4:] in FILES for link in linked)
    for name in FILES:
        assert not re.search(r"https?://", (await client.get(f"/ui/{name}")).text), name


async def test_status_lists_every_manifest_with_what_the_page_shows(api):
    client, coord = api
    status = (await client.get("/api/v1/status", headers=ADMIN)).json()
    assert abs(status["time"] - status["uptime_s"] - coord.started_at) < 5
    models = {m["id"]: m for m in status["models"]}
    assert models["a"]["aliases"] == ["alias-a"] and models["a"]["parallel"] == 2
    assert models["b"]["pin"] is True and models["a"]["pin"] is False
    assert models["a"]["category"] == "llm" and models["a"]["queued"] == 0
    assert models["b"]["vram_estimate"] == {"mb": 2000, "rung": "manifest",
                                            "detail": "vram_mb in the manifest"}

