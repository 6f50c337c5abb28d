"""One model by its id or an alias, through the official clients in-process: OpenAI's
``models.retrieve``, Anthropic's ``models.list`` and ``models.retrieve`` (its shape, told
apart by the ``anthropic-version`` header its SDK sends), Ollama's ``show`` of an alias; a
model outside the key's scope is a 404 on each, as one that does not exist."""

from __future__ import annotations

import anthropic
import httpx
import httpx2
import openai
import pytest

from .fakes import coordinator, manifest, started_client

ADMIN = "adm"


@pytest.fixture
async def api(tmp_path):
    coord, _ = coordinator(tmp_path, [
        manifest("qwen-a", 1000, aliases=["demo", "qwen:7b"], backend="llama-server",
                 ctx_size=4096, parallel=2),
        manifest("qwen-b", 1000), manifest("llama-c", 1000)], admin_api_key=ADMIN)
    async with started_client(coord) as client:
        created = await client.post("/api/v1/keys", json={"name": "scoped", "models": ["qwen*"]},
                                    headers={"authorization": f"Bearer {ADMIN}"})
        assert created.status_code == 201, created.text
        yield client, created.json()["key"]


def _clients(client: httpx.AsyncClient, key: str):
    """Both SDKs on the app in-process (they speak through httpx2, httpx's successor)."""
    app = client._transport.app  # type: ignore[attr-defined]
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app),
                              base_url="http://127.0.0.1")
    return (openai.AsyncOpenAI(base_url="http://127.0.0.1/v1", api_key=key, http_client=http),
            anthropic.AsyncAnthropic(base_url="http://127.0.0.1", api_key=key, http_client=http))


async def test_openai_retrieves_a_model_by_its_id_or_an_alias(api):
    client, key = api
    oai, _ = _clients(client, ADMIN)
    for name in ("qwen-a", "demo", "qwen:7b"):
        model = await oai.models.retrieve(name)
        assert model.id == "qwen-a" and model.object == "model"
        assert model.owned_by == "model-boss"
    with pytest.raises(openai.NotFoundError, match="'nope' does not exist"):
        await oai.models.retrieve("nope")
    scoped, _ = _clients(client, key)
    assert (await scoped.models.retrieve("demo")).id == "qwen-a"
    with pytest.raises(openai.NotFoundError, match="'llama-c' does not exist"):
        await scoped.models.retrieve("llama-c")  # outside its scope: as if it did not exist
    listed = [m.id async for m in scoped.models.list()]
    assert listed == ["qwen-a", "qwen-b"]


async def test_anthropic_lists_and_retrieves_models_in_its_own_shape(api):
    client, key = api
    _, claude = _clients(client, ADMIN)
    info = await claude.models.retrieve("demo")
    assert (info.type, info.id, info.display_name) == ("model", "qwen-a", "qwen-a")
    assert info.created_at.tzinfo is not None and info.max_input_tokens == 2048
    page = await claude.models.list(limit=2)
    assert [m.id for m in page.data] == ["qwen-a", "qwen-b"] and page.has_more
    assert [m.id for m in (await claude.models.list(after_id="qwen-b")).data] == ["llama-c"]
    assert [m.id async for m in claude.models.list(limit=1)] == ["qwen-a", "qwen-b", "llama-c"]
    with pytest.raises(anthropic.NotFoundError) as missing:
        await claude.models.retrieve("nope")
    assert missing.value.body["type"] == "error"  # Anthropic's envelope
    _, scoped = _clients(client, key)
    assert [m.id async for m in scoped.models.list()] == ["qwen-a", "qwen-b"]
    with pytest.raises(anthropic.NotFoundError):
        await scoped.models.retrieve("llama-c")
    raw = await client.get("/v1/models/demo", headers={"authorization": f"Bearer {ADMIN}",
                                                        "anthropic-version": "2023-06-01"})
    assert set(raw.json()) >= {"type", "id", "display_name", "created_at"}
    assert raw.json()["created_at"].endswith("Z")


async def test_ollama_shows_a_model_by_its_alias_within_the_keys_scope(api):
    client, key = api
    for name in ("demo", "qwen:7b", "qwen-a"):
        shown = await client.post("/api/show", json={"model": name},
                                  headers={"authorization": f"Bearer {key}"})
        assert shown.status_code == 200, (name, shown.text)
        assert "demo" in shown.json()["aliases"]
    hidden = await client.post("/api/show", json={"model": "llama-c"},
                               headers={"authorization": f"Bearer {key}"})
    assert hidden.status_code == 404 and "error" in hidden.json()
