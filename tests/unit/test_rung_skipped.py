"""A task ladder's rung that cannot serve the request (a model of the wrong kind) is passed over
with a ``rung_skipped`` event that says which model, task and rung, and why."""

from __future__ import annotations

from .fakes import coordinator, manifest, started_client


def chat(model: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}]}


async def test_a_wrong_kind_rung_is_skipped_with_a_reason(tmp_path):
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text("tasks:\n  ask:\n    candidates: [embedder, a]\n")
    embedder = manifest("embedder", 500, backend="transformers", category="embedding")
    coord, _ = coordinator(tmp_path, [embedder, manifest("a", 2000)], tasks_file=tasks)
    async with started_client(coord) as client:
        answer = await client.post("/v1/chat/completions", json=chat("task:ask"))
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-model-boss-model"] == "a"
        listed = (await client.get("/api/v1/events?stream=false")).json()["events"]
    skipped = [e for e in listed if e["type"] == "rung_skipped"]
    assert len(skipped) == 1, skipped
    event = skipped[0]
    assert (event["model"], event["task"], event["rung"]) == ("embedder", "ask", 0)
    assert event["endpoint"] == "/v1/chat/completions"
    assert event["code"] == "unsupported_endpoint"
    assert "kind 'embedding'" in event["reason"] and "/v1/embeddings" in event["reason"]
    assert not coord.events.recent("fallback")  # passed over, not tried and failed


async def test_every_rung_of_the_wrong_kind_is_a_400_and_each_is_recorded(tmp_path):
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text("tasks:\n  vec:\n    candidates: [embedder, reranker]\n")
    models = [manifest("embedder", 500, backend="transformers", category="embedding"),
              manifest("reranker", 500, backend="transformers", category="rerank")]
    coord, _ = coordinator(tmp_path, models, tasks_file=tasks)
    async with started_client(coord) as client:
        answer = await client.post("/v1/chat/completions", json=chat("task:vec"))
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "unsupported_endpoint"
    skipped = coord.events.recent("rung_skipped")
    assert [(e["model"], e["rung"]) for e in skipped] == [("embedder", 0), ("reranker", 1)]


async def test_a_model_asked_for_another_kinds_endpoint_is_refused_before_any_load(tmp_path):
    """llama.cpp answers no audio and no images, a pipeline only images: each is a 400 that
    names the models that do serve the route, and nothing is loaded to find out."""
    models = [manifest("a", 2000),
              manifest("voice", 500, backend="transformers", category="tts"),
              manifest("sd", 500, backend="diffusers", category="diffusion")]
    coord, _ = coordinator(tmp_path, models)
    async with started_client(coord) as client:
        speech = await client.post("/v1/audio/speech", json={"model": "a", "input": "hi"})
        images = await client.post("/v1/images/generations", json={"model": "a", "prompt": "x"})
        heard = await client.post("/v1/audio/transcriptions", data={"model": "a"},
                                  files={"file": ("a.wav", b"RIFF0000WAVE", "audio/wav")})
        chat_sd = await client.post("/v1/chat/completions", json=chat("sd"))
    for answer in (speech, images, heard, chat_sd):
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "unsupported_endpoint"
        assert answer.json()["error"]["param"] == "model"
    assert speech.json()["error"]["message"] == (
        "'a' is a model of kind 'llm'; it does not serve /v1/audio/speech; models that do: "
        "voice")
    assert images.json()["error"]["message"].endswith("models that do: sd")
    assert "/v1/audio/transcriptions" in heard.json()["error"]["message"]
    assert "it serves /v1/images/generations, /v1/images/edits, not /v1/chat/completions" \
        in chat_sd.json()["error"]["message"]
    assert not coord.events.recent("load_started")
    assert all(slot.state == "idle" for slot in coord.pool.slots.values())
