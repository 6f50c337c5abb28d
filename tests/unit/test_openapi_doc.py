"""The API's own pages (api/openapi_doc.py, app.py): /docs and /redoc load every asset from this
server (the package's copies of Swagger UI and ReDoc), none from a CDN; their browser test is
tests/e2e/test_docs_page.py."""

from __future__ import annotations

import re

import pytest

from .fakes import coordinator, manifest, started_client


@pytest.fixture
async def client(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("a", 1000)])
    async with started_client(coord) as client:
        yield client


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_the_docs_pages_load_their_assets_from_this_server(client, page):
    html = (await client.get(page)).text
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert assets and all(a.startswith("/") for a in assets), assets
    assert "https://" not in html.replace("https://redocly.com", "")
    for asset in assets:
        served = await client.get(asset)
        assert served.status_code == 200 and len(served.content) > 1000, asset


async def test_redoc_keeps_its_images_on_this_server(client):
    policy = (await client.get("/redoc")).headers["content-security-policy"]
    assert "img-src 'self' data:" in policy
