"""The dashboard's files at /ui (served without a key, only the files named), the first
snapshot the page comes with (only for a caller the API answers), and the status document's
views the page reads: every manifest, and each lease under the holder it was taken with."""

from __future__ import annotations

import json
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



# ---------------------------------------------------------------- the first snapshot

SNAPSHOT = re.compile(r'<script type="application/json" id="snapshot">(.*?)</script>', re.S)


def snapshot_in(html: str) -> dict | None:
    found = SNAPSHOT.search(html)
    return json.loads(found.group(1)) if found else None


async def test_page_embeds_the_first_snapshot_only_for_a_caller_the_api_answers(api):
    """The page is open, the API is not: the snapshot goes only to a caller whose key
    /api/v1/status would take, so the page tells a keyless caller nothing."""
    client, _ = api
    for headers in ({}, {"authorization": "Bearer user-key"},
                    {"authorization": "Bearer wrong"}):
        page = await client.get("/ui/", headers=headers)
        assert page.status_code == 200 and snapshot_in(page.text) is None, headers
        assert "alias-a" not in page.text and "lease_store" not in page.text
    page = await client.get("/ui/", headers=ADMIN)
    assert page.headers["cache-control"] == "no-store"
    snapshot = snapshot_in(page.text)
    assert snapshot is not None
    assert [m["id"] for m in snapshot["status"]["models"]] == ["a", "b"]
    assert snapshot["queue"] == {"total": 0, "offset": 0, "waiting": []}
    assert snapshot["config"] == (await client.get("/api/v1/config", headers=ADMIN)).json()


async def test_open_server_embeds_every_panel_and_escapes_markup(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("a", 1000)])
    async with started_client(coord) as client:
        hostile = "</script><script>alert(1)</script><!--"
        taken = await client.post("/api/v1/leases", json={
            "vram_mb": 500, "kind": "training", "holder": "trainer-7", "note": hostile})
        assert taken.status_code == 201
        html = (await client.get("/ui/")).text
        assert "<script>alert(1)" not in html and html.count("</script>") == 2
        snapshot = snapshot_in(html)
        assert snapshot is not None and set(snapshot) == {"status", "queue", "config"}
        status = snapshot["status"]
        assert [g["index"] for g in status["gpus"]] == [0]
        assert [(lease["holder"], lease["note"]) for lease in status["leases"]] == [
            ("trainer-7", hostile)]
        assert snapshot["config"] == (await client.get("/api/v1/config")).json()


# ---------------------------------------------------------------- lease holders

async def test_a_lease_is_listed_under_the_holder_it_was_taken_with(tmp_path):
    """The name given is the holder; where the lease was asked from is kept beside it."""
    coord, _ = coordinator(tmp_path, [manifest("a", 1000)])
    async with started_client(coord) as client:
        await client.post("/api/v1/leases", json={"vram_mb": 500, "holder": "trainer-7"})
        await client.post("/api/v1/leases", json={"vram_mb": 500})
        leases = (await client.get("/api/v1/status")).json()["leases"]
        assert sorted((lease["holder"], lease["address"]) for lease in leases) == [
            ("http:127.0.0.1", "127.0.0.1"), ("trainer-7", "127.0.0.1")]


async def test_a_named_key_names_the_holder_of_a_lease_taken_without_one(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("a", 1000)],
                           api_keys={"alice": "k-alice", "bob": "k-bob"})
    async with started_client(coord) as client:
        for key, body in (("k-alice", {}), ("k-bob", {"holder": "bob-notebook"})):
            taken = await client.post("/api/v1/leases", json={"vram_mb": 500, **body},
                                      headers={"authorization": f"Bearer {key}"})
            assert taken.status_code == 201
        leases = (await client.get("/api/v1/status",
                                   headers={"authorization": "Bearer k-alice"})).json()["leases"]
        assert sorted(lease["holder"] for lease in leases) == ["alice", "bob-notebook"]
