"""The coding agents ``model-boss launch`` starts, and what each needs to use the daemon:
pure functions from a :class:`~.plan.Target` and the agent's own arguments to a
:class:`~.plan.Launch`. Nothing here touches the environment or the disk."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .plan import Launch, Target

PROVIDER = "modelboss"  # the provider id the agents' configs name the daemon by
# Codex gives up on a stream silent this long (its default: 5 minutes) and sends the request
# again; a long prompt prefilled on a CPU stays silent longer than that before its first token
CODEX_STREAM_IDLE_MS = 30 * 60 * 1000
CLAUDE_ANSWER_MAX = 32_000  # Claude Code's own ceiling for an answer
KEY_VARIABLE = "MODEL_BOSS_API_KEY"  # where codex and opencode read the key from


@dataclass(frozen=True)
class Agent:
    """One agent: its command, the package that installs it, the size of the first prompt it
    sends (tokens, with its default tools; ``None``: not measured, not checked), how to
    point it at the daemon (``build(target, agent_args, files_dir)``), and how it runs
    without a terminal: ``batch``, the first arguments that say so, and an example."""

    name: str
    binary: str
    install: str
    first_prompt: int | None
    build: Callable[[Target, list[str], Path], Launch]
    batch: tuple[str, ...] = ()
    batch_example: str = ""

    def interactive(self, args: list[str]) -> bool:
        """Whether the agent, given ``args``, runs in a terminal (its screen, its prompts)."""
        return not any(arg in self.batch or arg.split("=", 1)[0] in self.batch for arg in args)


def claude_code(target: Target, args: list[str], files_dir: Path) -> Launch:
    """Claude Code speaks Anthropic's Messages API to ``$ANTHROPIC_BASE_URL/v1/messages``;
    every model name it would pick (its default, the Opus / Sonnet / Haiku ones, the
    background and sub-agent ones) is the daemon's model."""
    model = target.model
    env: dict[str, str | None] = {
        "ANTHROPIC_BASE_URL": target.url,
        "ANTHROPIC_AUTH_TOKEN": target.key_or_placeholder,  # sent as Authorization: Bearer
        # an Anthropic key in the caller's shell would be sent to the daemon, and Claude Code
        # refuses to choose between the two
        "ANTHROPIC_API_KEY": None,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,  # the background model's older name
        "CLAUDE_CODE_SUBAGENT_MODEL": model,
        # it asks an unknown model for 32,000 tokens of answer, more than a small one holds
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(answer_limit(target.context, CLAUDE_ANSWER_MAX)),
        # no telemetry, error reports, update checks or feedback: nothing leaves the host
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    # the answer's bound is the caller's where they chose one (a shorter one to keep a slow
    # CPU model's answers short, a longer one for a large context)
    return Launch(["claude", *args], env, secrets=frozenset({"ANTHROPIC_AUTH_TOKEN"}),
                  defaults=frozenset({"CLAUDE_CODE_MAX_OUTPUT_TOKENS"}))


def codex(target: Target, args: list[str], files_dir: Path) -> Launch:
    """Codex speaks the Responses API (``wire_api = "responses"``, the only one it still
    has) to a provider defined on its command line, so ``~/.codex/config.toml`` is left
    alone; the key is read from ``$MODEL_BOSS_API_KEY``."""
    provider = f"model_providers.{PROVIDER}"
    overrides = [
        f"model_provider={toml_string(PROVIDER)}",
        f"model={toml_string(target.model)}",
        f"{provider}.name={toml_string('model-boss')}",
        f"{provider}.base_url={toml_string(target.url + '/v1')}",
        f"{provider}.wire_api={toml_string('responses')}",
        f"{provider}.env_key={toml_string(KEY_VARIABLE)}",
        f"{provider}.stream_idle_timeout_ms={CODEX_STREAM_IDLE_MS}",
        f"model_context_window={target.context}",  # it compacts before the model's end
        "check_for_update_on_startup=false",
        "analytics.enabled=false",
    ]
    options = [part for override in overrides for part in ("-c", override)]
    return Launch(["codex", *options, *args], {KEY_VARIABLE: target.key_or_placeholder},
                  secrets=frozenset({KEY_VARIABLE}),
                  shown_args=[f"-c {override}" for override in overrides])


def aider(target: Target, args: list[str], files_dir: Path) -> Launch:
    """aider talks to an OpenAI-compatible server through litellm (``openai/`` models at
    ``$OPENAI_API_BASE``); its context comes from a model metadata file, as litellm knows
    nothing of the daemon's models."""
    name = f"openai/{target.model}"
    metadata = files_dir / "aider-model-metadata.json"
    content = json.dumps({name: {
        "max_input_tokens": target.context, "max_tokens": answer_limit(target.context),
        "max_output_tokens": answer_limit(target.context), "input_cost_per_token": 0.0,
        "output_cost_per_token": 0.0, "litellm_provider": "openai", "mode": "chat"}}, indent=2)
    shown = [f"--model {name}", f"--model-metadata-file {metadata}",
             "--no-show-model-warnings", "--no-check-update", "--no-analytics"]
    options = [part for option in shown for part in option.split(" ", 1)]
    env: dict[str, str | None] = {"OPENAI_API_BASE": target.url + "/v1",
                                  "OPENAI_API_KEY": target.key_or_placeholder}
    return Launch(["aider", *options, *args], env, files={metadata: content + "\n"},
                  secrets=frozenset({"OPENAI_API_KEY"}), shown_args=shown)


def opencode(target: Target, args: list[str], files_dir: Path) -> Launch:
    """opencode takes a config as JSON in ``$OPENCODE_CONFIG_CONTENT`` (over its config
    files): an OpenAI-compatible provider with the model and its limits; the key is read
    from ``$MODEL_BOSS_API_KEY`` (``{env:...}``), so the JSON holds no secret."""
    model = f"{PROVIDER}/{target.model}"
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {PROVIDER: {
            "npm": "@ai-sdk/openai-compatible", "name": "model-boss",
            "options": {"baseURL": target.url + "/v1", "apiKey": "{env:" + KEY_VARIABLE + "}"},
            "models": {target.model: {"name": target.model, "limit": {
                "context": target.context, "output": answer_limit(target.context)}}}}},
        "model": model, "small_model": model,
        "autoupdate": False, "share": "disabled",
    }
    env: dict[str, str | None] = {"OPENCODE_CONFIG_CONTENT": json.dumps(config),
                                  KEY_VARIABLE: target.key_or_placeholder}
    return Launch(["opencode", *args], env, secrets=frozenset({KEY_VARIABLE}))


def answer_limit(context: int, most: int = 8192) -> int:
    """The most an agent is told one answer may take: a quarter of the context, at most
    ``most``."""
    return max(256, min(most, context // 4))


def toml_string(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's), for ``codex -c key=value``."""
    return json.dumps(value, ensure_ascii=False)


# The first prompt each sends with its default tools, in tokens: the system prompt, the tool
# schemas and a short request (tests/data/agents/ holds the ones captured). claude, codex and
# aider: the figures; opencode 1.18.33: its system prompt and task (2,190 SmolLM2
# tokens) and its 10 tool schemas as JSON (5,390). A chat template that leaves tools out (the
# demo model's) sends less; another tokenizer moves them by a tenth or so.
AGENTS: dict[str, Agent] = {agent.name: agent for agent in (
    Agent("claude", "claude", "npm install -g @anthropic-ai/claude-code", 7_625, claude_code,
          ("-p", "--print"), '-- -p "PROMPT"'),
    Agent("codex", "codex", "npm install -g @openai/codex", 4_556, codex,
          ("exec", "e"), '-- exec "PROMPT"'),
    Agent("aider", "aider", "python -m pip install aider-chat", 669, aider,
          ("--message", "-m", "--message-file", "-f"), '-- --message "PROMPT"'),
    Agent("opencode", "opencode", "npm install -g opencode-ai", 7_580, opencode,
          ("run",), '-- run "PROMPT"'),
)}
