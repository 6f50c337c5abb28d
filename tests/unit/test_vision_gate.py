"""Image content reaches only a model with a vision projector; any other answers a clear 400
in the route's envelope before anything is loaded."""

from __future__ import annotations

import pytest

from .fakes import coordinator, manifest, started_client

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
CHAT = {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is it?"},
                                                  IMAGE]}]}
ANTHROPIC = {"max_tokens": 8, "messages": [{"role": "user", "content": [
    {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                 "data": "iVBORw0KGgo="}}]}]}


@pytest.fixture
async def client(tmp_path):
    coord, log = coordinator(tmp_path, [manifest("blind"), manifest("seer", mmproj="p.gguf"),
                                        manifest("vision", category="vision")])
    async with started_client(coord) as http:
        yield http, log


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT),
                                             ("/v1/messages", ANTHROPIC)])
async def test_a_model_without_a_projector_refuses_images_before_any_load(client, path, body):
    http, log = client
    answer = await http.post(path, json={"model": "blind", **body})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert "cannot read images" in error["message"] and "mmproj" in error["message"]
    assert not any(entry[0] == "start" for entry in log)  # nothing was loaded for it


@pytest.mark.parametrize("model", ["seer", "vision"])
async def test_a_model_with_a_projector_gets_them(client, model):
    http, log = client
    answer = await http.post("/v1/chat/completions", json={"model": model, **CHAT})
    assert answer.status_code == 200, answer.text
    assert ("start", model) in log


async def test_ollama_images_follow_the_same_rule(client):
    http, _ = client
    refused = await http.post("/api/chat", json={"model": "blind", "stream": False, "messages": [
        {"role": "user", "content": "what is it?", "images": ["iVBORw0KGgo="]}]})
    assert refused.status_code == 400 and "cannot read images" in refused.json()["error"]
