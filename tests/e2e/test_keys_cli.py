"""Keys made and revoked live through ``model-boss keys`` against a real daemon: the secret
is printed once, alone on the last line; the key works at once, scoped to its models; a
revoked key is refused on its next request, a streaming one too; ``model-boss usage`` reads
what it used. The model is a ``cloud`` manifest over ``tests/fake_upstream.py``."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import openai
import pytest

from tests.conftest import ServerProcess
from tests.e2e.test_cloud_backend import KEY as UPSTREAM
from tests.e2e.test_cloud_backend import cloud, start_upstream

pytestmark = pytest.mark.slow

ADMIN = "admin-secret"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    upstream, port = start_upstream("--require-key", UPSTREAM, "--chunks", "4")
    server = ServerProcess(tmp_path_factory.mktemp("keys-cli"), {"admin_api_key": ADMIN},
                           [cloud("cloud:qwen-x", port), cloud("cloud:llama-y", port)],
                           env={"FAKE_UPSTREAM_KEY": UPSTREAM})
    try:
        yield server.start(60)
    finally:
        server.stop()
        upstream.terminate()
        upstream.wait(10)


def cli(server: ServerProcess, *args: str, key: str = ADMIN) -> subprocess.CompletedProcess:
    env = {**os.environ, "MODEL_BOSS_URL": server.url, "MODEL_BOSS_ADMIN_API_KEY": key}
    return subprocess.run([sys.executable, "-m", "model_boss", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_key_made_with_the_cli_works_until_revoked_with_it(server):
    made = cli(server, "keys", "create", "alice", "--models", "cloud:qwen*",
               "--tokens-per-day", "2000000")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip().splitlines()[-1]
    assert secret.startswith("mb-") and " " not in secret
    listed = cli(server, "keys", "list")
    assert listed.returncode == 0 and "alice" in listed.stdout
    assert secret not in listed.stdout and "tokens_per_day=2000000" in listed.stdout

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=secret, max_retries=0)
    assert [m.id for m in client.models.list()] == ["cloud:qwen-x"]
    answer = client.chat.completions.create(
        model="cloud:qwen-x", messages=[{"role": "user", "content": "one two three"}])
    assert answer.usage.prompt_tokens == 1 and answer.usage.completion_tokens == 2
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="cloud:llama-y",
                                       messages=[{"role": "user", "content": "hi"}])
    stream = client.chat.completions.create(
        model="cloud:qwen-x", stream=True, messages=[{"role": "user", "content": "hi"}])
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    usage = cli(server, "usage", "--group-by", "key,model")
    assert usage.returncode == 0, usage.stderr
    assert "alice" in usage.stdout and "cloud:qwen-x" in usage.stdout

    revoked = cli(server, "keys", "revoke", "alice")
    assert revoked.returncode == 0, revoked.stderr
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="cloud:qwen-x",
                                       messages=[{"role": "user", "content": "hi"}])
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=30,
                      headers={"authorization": f"Bearer {secret}"},
                      json={"model": "cloud:qwen-x", "stream": True,
                            "messages": [{"role": "user", "content": "hi"}]}) as refused:
        assert refused.status_code == 401
    # the CLI says the daemon's refusal in one line, with no traceback
    again = cli(server, "keys", "revoke", "alice")
    assert again.returncode == 1 and again.stderr.strip() == "model-boss: no key named 'alice'"
    stranger = cli(server, "keys", "list", key=secret)
    assert stranger.returncode == 1 and "Traceback" not in stranger.stderr
