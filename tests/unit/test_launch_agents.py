"""``model-boss launch``'s agents as pure functions: the environment, options and files each
is given to use the daemon, and the lines that say so (a key never shown whole)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from model_boss.launch import AGENTS, Launch, Target, mask
from model_boss.launch.agents import CODEX_STREAM_IDLE_MS, answer_limit, toml_string
from model_boss.launch.plan import NO_KEY

KEY = "mb-secret-key-0123456789abcdef"
TARGET = Target(url="http://127.0.0.1:8210", key=KEY, model="qwen2.5-coder-7b", context=32768)
FILES = Path("/cache/model-boss/launch")


def build(agent: str, *args: str, target: Target = TARGET) -> Launch:
    return AGENTS[agent].build(target, list(args), FILES)


def test_claude_code_gets_the_daemon_for_every_model_it_would_pick() -> None:
    launch = build("claude", "-p", "say hi")
    assert launch.argv == ["claude", "-p", "say hi"]
    env = launch.env
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8210"  # it adds /v1/messages
    assert env["ANTHROPIC_AUTH_TOKEN"] == KEY
    models = {name: value for name, value in env.items() if name.endswith("_MODEL")}
    assert set(models) == {"ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL",
                           "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                           "ANTHROPIC_SMALL_FAST_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL"}
    assert set(models.values()) == {"qwen2.5-coder-7b"}
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "8192"  # a quarter of 32k
    for switch in ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_TELEMETRY",
                   "DISABLE_ERROR_REPORTING", "DISABLE_AUTOUPDATER"):
        assert env[switch] == "1"


def test_claude_code_drops_an_anthropic_key_from_the_shell() -> None:
    launch = build("claude")
    assert launch.env["ANTHROPIC_API_KEY"] is None
    merged = launch.environ({"ANTHROPIC_API_KEY": "sk-ant-real", "PATH": "/bin"})
    assert "ANTHROPIC_API_KEY" not in merged and merged["PATH"] == "/bin"
    assert "unset ANTHROPIC_API_KEY" in launch.describe({"ANTHROPIC_API_KEY": "sk-ant-real"})
    assert "unset ANTHROPIC_API_KEY" not in launch.describe({})  # nothing to say


def test_claude_code_keeps_an_answer_bound_the_caller_chose() -> None:
    """The answer's bound is a tuning: the caller's own is kept (and said), launch's is set
    where there is none; what points the agent at the daemon is launch's whatever the shell
    says."""
    launch = build("claude")
    caller = {"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "256", "ANTHROPIC_BASE_URL": "https://elsewhere"}
    merged = launch.environ(caller)
    assert merged["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "256"
    assert merged["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8210"
    assert "CLAUDE_CODE_MAX_OUTPUT_TOKENS=256 (yours, kept)" in launch.describe(caller)
    assert launch.environ({})["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "8192"
    assert "CLAUDE_CODE_MAX_OUTPUT_TOKENS=8192" in launch.describe({})


def test_codex_gets_a_responses_provider_on_its_command_line() -> None:
    launch = build("codex", "exec", "--skip-git-repo-check", "say hi")
    argv = launch.argv
    assert argv[0] == "codex" and argv[-3:] == ["exec", "--skip-git-repo-check", "say hi"]
    flags = argv[1:-3]
    assert flags[::2] == ["-c"] * (len(flags) // 2)
    config = tomllib.loads("\n".join(flags[1::2]))  # each override is a line of TOML
    assert config["model_provider"] == "modelboss" and config["model"] == "qwen2.5-coder-7b"
    assert config["model_providers"]["modelboss"] == {
        "name": "model-boss", "base_url": "http://127.0.0.1:8210/v1", "wire_api": "responses",
        "env_key": "MODEL_BOSS_API_KEY", "stream_idle_timeout_ms": CODEX_STREAM_IDLE_MS}
    assert config["model_context_window"] == 32768
    assert config["check_for_update_on_startup"] is False
    assert config["analytics"] == {"enabled": False}
    assert launch.env == {"MODEL_BOSS_API_KEY": KEY}


def test_aider_gets_an_openai_base_and_the_models_context_in_a_metadata_file() -> None:
    launch = build("aider", "main.py")
    metadata = FILES / "aider-model-metadata.json"
    assert launch.argv == ["aider", "--model", "openai/qwen2.5-coder-7b",
                           "--model-metadata-file", str(metadata), "--no-show-model-warnings",
                           "--no-check-update", "--no-analytics", "main.py"]
    assert launch.env == {"OPENAI_API_BASE": "http://127.0.0.1:8210/v1", "OPENAI_API_KEY": KEY}
    known = json.loads(launch.files[metadata])["openai/qwen2.5-coder-7b"]
    assert known["max_input_tokens"] == 32768 and known["max_output_tokens"] == 8192
    assert known["input_cost_per_token"] == 0 and known["litellm_provider"] == "openai"


def test_opencode_gets_a_provider_in_its_inline_config_without_the_key() -> None:
    launch = build("opencode", "run", "say hi")
    assert launch.argv == ["opencode", "run", "say hi"]
    raw = launch.env["OPENCODE_CONFIG_CONTENT"]
    assert raw is not None and KEY not in raw
    config = json.loads(raw)
    provider = config["provider"]["modelboss"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": "http://127.0.0.1:8210/v1",
                                   "apiKey": "{env:MODEL_BOSS_API_KEY}"}
    assert provider["models"]["qwen2.5-coder-7b"]["limit"] == {"context": 32768,
                                                               "output": 8192}
    assert config["model"] == config["small_model"] == "modelboss/qwen2.5-coder-7b"
    assert config["autoupdate"] is False and config["share"] == "disabled"
    assert launch.env["MODEL_BOSS_API_KEY"] == KEY


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_no_line_shows_the_key(agent: str) -> None:
    lines = build(agent).describe({})
    assert lines and not any(KEY in line for line in lines)
    assert any("mb-s…" in line and "(30 characters)" in line for line in lines)


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_a_daemon_without_keys_gets_a_placeholder(agent: str) -> None:
    launch = build(agent, target=Target(TARGET.url, None, TARGET.model, TARGET.context))
    secrets = [launch.env[name] for name in launch.secrets]
    assert secrets and all(value == NO_KEY for value in secrets)


@pytest.mark.parametrize(("secret", "shown"), [
    ("short", "… (5 characters)"),  # too short to show any of it
    ("0123456789abcdef", "0123… (16 characters)"),
    (NO_KEY, f"{NO_KEY} (no key: the daemon asks for none)"),
])
def test_mask(secret: str, shown: str) -> None:
    assert mask(secret) == shown


@pytest.mark.parametrize(("context", "limit"), [(2048, 512), (32768, 8192), (500, 256)])
def test_answer_limit(context: int, limit: int) -> None:
    assert answer_limit(context) == limit


@pytest.mark.parametrize(("context", "limit"), [(8192, "2048"), (131072, "32000")])
def test_claude_codes_answers_fit_the_model(context: int, limit: str) -> None:
    target = Target(TARGET.url, KEY, TARGET.model, context)
    assert build("claude", target=target).env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == limit


def test_toml_strings_escape_what_toml_would_misread() -> None:
    value = 'a "quoted" back\\slash'
    assert tomllib.loads("v = " + toml_string(value))["v"] == value


def test_every_agent_names_its_package() -> None:
    assert {name: agent.install for name, agent in AGENTS.items()} == {
        "claude": "npm install -g @anthropic-ai/claude-code",
        "codex": "npm install -g @openai/codex",
        "aider": "python -m pip install aider-chat",
        "opencode": "npm install -g opencode-ai"}
