"""Popular OpenAI clients against model-boss, unchanged: ``langchain-openai``, ``litellm`` and
the ``llm`` CLI (its OpenAI-compatible model configuration), on the native llama.cpp worker.

They come with the ``clients`` extra (``pip install -e '.[clients]'``; ``.ci/run`` installs
it); without them this module is skipped, saying which is missing.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ServerProcess, llama_manifest

# litellm fetches its model price list over the network at import unless told not to
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

REASON = "needs the 'clients' extra: pip install -e '.[clients]'"
MISSING = [name for name in ("langchain_openai", "litellm", "llm")
           if importlib.util.find_spec(name) is None]
if MISSING:
    pytest.skip(f"{', '.join(MISSING)} not installed: {REASON}", allow_module_level=True)

pytestmark = pytest.mark.slow

FLAG = {"title": "flag", "type": "object", "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"], "additionalProperties": False}
HI = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_gguf):
    srv = ServerProcess(tmp_path_factory.mktemp("clients"),
                        {"gpus": [{"index": 0, "name": "sim-8g", "vram_mb": 8192}]},
                        [llama_manifest("smol", demo_gguf)])
    srv.start()
    yield srv
    srv.stop()


# --- langchain-openai ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def langchain_openai():
    """Imported here, not at collection: every test process collects this module, and
    langchain and litellm take seconds to import."""
    return importlib.import_module("langchain_openai")


@pytest.fixture(scope="module")
def litellm():
    return importlib.import_module("litellm")


@pytest.fixture(scope="module")
def chat_model(server, langchain_openai):
    return langchain_openai.ChatOpenAI(base_url=server.url + "/v1", api_key="unused",
                                       model="smol", max_tokens=8, temperature=0)


def test_langchain_invoke_and_stream(chat_model):
    assert chat_model.invoke("Say hello.").content.strip()
    pieces = [chunk.content for chunk in chat_model.stream("Say hello.")]
    assert len(pieces) > 2 and "".join(pieces).strip()


async def test_langchain_async(chat_model):
    assert (await chat_model.ainvoke("Say hello.")).content.strip()
    pieces = [chunk.content async for chunk in chat_model.astream("Say hello.")]
    assert "".join(pieces).strip()


def test_langchain_structured_output(server, langchain_openai):
    model = langchain_openai.ChatOpenAI(base_url=server.url + "/v1", api_key="unused",
                                        model="smol", max_tokens=24, temperature=0)
    answer = model.with_structured_output(FLAG, method="json_schema").invoke("Is the sky blue?")
    assert set(answer) == {"ok"} and isinstance(answer["ok"], bool)


# --- litellm -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def route(server, litellm):
    litellm.suppress_debug_info = True
    return {"model": "openai/smol", "api_base": server.url + "/v1", "api_key": "unused"}


def test_litellm_completion_and_stream(route, litellm):
    reply = litellm.completion(messages=HI, max_tokens=5, **route)
    assert reply.choices[0].message.content and reply.usage.completion_tokens <= 5
    chunks = list(litellm.completion(messages=HI, max_tokens=5, stream=True, **route))
    assert "".join(c.choices[0].delta.content or "" for c in chunks).strip()


async def test_litellm_async(route, litellm):
    reply = await litellm.acompletion(messages=HI, max_tokens=3, **route)
    assert reply.choices[0].message.content


def test_litellm_sees_model_boss_400s_as_bad_requests(route, litellm):
    with pytest.raises(litellm.BadRequestError, match="serves at most 1 choice"):
        litellm.completion(messages=HI, max_tokens=3, n=3, **route)


# --- the llm CLI ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llm_home(server, tmp_path_factory):
    """An LLM_USER_PATH whose extra-openai-models.yaml names model-boss's smol."""
    home = tmp_path_factory.mktemp("llm-home")
    (home / "extra-openai-models.yaml").write_text(yaml.safe_dump([
        {"model_id": "mb-smol", "model_name": "smol", "api_base": server.url + "/v1"}]))
    return home


def llm_cli(home, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LLM_USER_PATH": str(home)}
    env.pop("OPENAI_API_KEY", None)  # model-boss without api_key needs none
    return subprocess.run([sys.executable, "-m", "llm", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_llm_cli_lists_and_prompts_the_model(llm_home):
    """Listed from its model configuration, then a streamed answer with a system prompt (the
    non-streamed path is the same ``openai`` client call that tests/e2e/test_openai_fidelity.py
    covers; each run of the CLI costs seconds of imports)."""
    listed = llm_cli(llm_home, "models", "list")
    assert listed.returncode == 0 and "mb-smol" in listed.stdout, listed.stderr
    done = llm_cli(llm_home, "-m", "mb-smol", "-s", "Answer in one word.", "Colour of grass?",
                   "-o", "max_tokens", "4")
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
