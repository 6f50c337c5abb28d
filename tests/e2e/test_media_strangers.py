"""The routes of pictures in, clips and adapters as a stranger meets them: a page on another
site (foreign Origin or Host) is refused before any work, a key's scope hides an adapter as
if it did not exist (whatever client id the request claims), and wrong keys, types and
models get their errors in OpenAI's envelope."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import ServerProcess, llama_manifest

pytestmark = pytest.mark.slow

BOB = {"authorization": "Bearer bob-key-0123456789"}
CAROL = {"authorization": "Bearer carol-key-0123456789"}  # a scope with no picture model
ADMIN = {"authorization": "Bearer admin-key-0123456789"}
MEDIA = ("/v1/videos", "/v1/images/edits", "/sdapi/v1/txt2img", "/sdapi/v1/img2img")


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf, tiny_sd):
    from tests.lora_fixtures import shared_lora
    from tests.video_fixtures import shared_tiny_video

    base = llama_manifest("smol", demo_gguf, adapters=[
        {"id": "smol-sql", "path": str(shared_lora(tmp_path_factory, "smol-a", 0))}])
    # a picture and a video model a request could load: refused before any work, neither does
    media = [{"id": "tiny-sd", "category": "diffusion", "backend": "diffusers",
              "path": str(tiny_sd), "vram_mb": 1000},
             {"id": "tiny-wan", "category": "video", "backend": "diffusers",
              "path": str(shared_tiny_video(tmp_path_factory)), "vram_mb": 1000}]
    config = {"admin_api_key": "admin-key-0123456789",
              "api_keys": {"bob": "bob-key-0123456789", "carol": "carol-key-0123456789"},
              "clients": {"bob": {"allowed_models": ["other", "tiny-*"]},
                          "carol": {"allowed_models": ["other"]}}}
    srv = ServerProcess(tmp_path_factory.mktemp("strangers"), config,
                        [base, llama_manifest("other", demo_gguf), *media], headers=ADMIN)
    srv.start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("path", MEDIA)
def test_a_page_on_another_site_is_refused_before_any_work(server, path):
    # a request the key may make (its scope holds the model), that would load the model
    body = {"prompt": "x", "model": "tiny-wan" if path == "/v1/videos" else "tiny-sd"}
    origin = httpx.post(server.url + path, json=body,
                        headers={**BOB, "origin": "https://evil.example"})
    assert origin.status_code == 403 and origin.json()["error"]["code"] == "origin_not_allowed"
    host = httpx.post(server.url + path, json=body, headers={**BOB, "host": "evil.example"})
    assert host.status_code == 403, host.text
    status = server.status()
    assert not any(s["loads"] or s["state"] != "idle" for s in status["slots"]), \
        status["slots"]  # nothing loaded or loading for them
    jobs = httpx.get(server.url + "/api/v1/jobs", headers=ADMIN, timeout=10)
    assert jobs.status_code == 200 and not jobs.json()["jobs"], jobs.text  # no job either


@pytest.mark.parametrize("claimed", [None, "admin", "smol-sql"])
def test_an_adapter_outside_a_keys_scope_does_not_exist(server, claimed):
    headers = {**BOB, **({"x-client-id": claimed} if claimed else {})}
    answer = httpx.post(server.url + "/v1/chat/completions", headers=headers, json={
        "model": "smol-sql", "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "model_not_found"
    listed = [m["id"] for m in httpx.get(server.url + "/v1/models", headers=headers).json()["data"]]
    assert listed == ["other", "tiny-sd", "tiny-wan"]  # its scope's, the adapter not among them


@pytest.mark.parametrize("path, body, status, param", [
    ("/v1/videos", {"prompt": 5, "model": "other"}, 400, "prompt"),
    ("/v1/videos", {"model": "other"}, 400, "prompt"),
    ("/v1/videos", {"prompt": "x", "model": "nope"}, 404, "model"),
    ("/v1/images/edits", {"prompt": "x", "image": "aGk=", "model": "other"}, 400, "image"),
    ("/v1/images/edits", {"prompt": "x", "model": "other"}, 400, "image"),
    ("/sdapi/v1/txt2img", {"prompt": "x", "model": "nope"}, 404, "model"),
    ("/sdapi/v1/img2img", {"prompt": "x", "model": "other"}, 400, "init_images"),
])
def test_bad_requests_get_their_error_in_openais_envelope(server, path, body, status, param):
    answer = httpx.post(server.url + path, headers=ADMIN, json=body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error


def test_txt2img_without_a_picture_model_in_reach_is_404_on_model(server):
    answer = httpx.post(server.url + "/sdapi/v1/txt2img", headers=CAROL, json={"prompt": "x"})
    assert answer.status_code == 404, answer.text
    error = answer.json()["error"]
    assert error["param"] == "model" and error["type"] == "invalid_request_error", error


def test_a_wrong_key_is_401_and_every_route_is_documented(server):
    for path in MEDIA:
        assert httpx.post(server.url + path, json={"prompt": "x"},
                          headers={"authorization": "Bearer wrong"}).status_code == 401
    paths = httpx.get(server.url + "/openapi.json", headers=ADMIN).json()["paths"]
    for path in (*MEDIA, "/v1/videos/{video_id}", "/v1/videos/{video_id}/content",
                 "/sdapi/v1/sd-models", "/sdapi/v1/options"):
        assert path in paths, path
