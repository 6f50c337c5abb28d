"""Whether a model's context holds an agent's first prompt: the refusal, with its figures and
what to change, table-driven; the manifest it names found on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_boss.launch import (
    AGENTS,
    ANSWER_ROOM,
    Agent,
    ServedModel,
    find_manifest,
    needed_context,
)
from model_boss.launch import refusal as refusal_of


def model(context: int, trained: int | None = 8192, source: str = "manifest") -> ServedModel:
    return ServedModel("smollm2-135m", context, trained, source)


def test_the_first_prompts_are_the_measured_ones() -> None:
    assert {name: agent.first_prompt for name, agent in AGENTS.items()} == {
        "claude": 7_625, "codex": 4_556, "aider": 669, "opencode": 7_580}
    assert needed_context(AGENTS["claude"]) == 7_625 + ANSWER_ROOM


@pytest.mark.parametrize(("agent", "context", "fits"), [
    ("claude", 8192, True),  # the demo model at its trained context: Claude Code fits
    ("claude", 8137, True),  # exactly the prompt and the room for an answer
    ("claude", 8136, False),
    ("claude", 4096, False),
    ("codex", 8192, True),
    ("codex", 4096, False),
    ("aider", 2048, True),
    ("aider", 1024, False),
    ("opencode", 8092, True),
    ("opencode", 8091, False),
])
def test_what_fits(agent: str, context: int, fits: bool) -> None:
    assert (refusal_of(AGENTS[agent], model(context), None) is None) is fits


def test_an_agent_not_measured_is_not_checked() -> None:
    unmeasured = Agent("x", "x", "install x", None, AGENTS["aider"].build)
    assert needed_context(unmeasured) is None
    assert refusal_of(unmeasured, model(64), None) is None


def test_a_manifest_model_is_refused_with_the_figures_and_the_file() -> None:
    said = refusal_of(AGENTS["claude"], model(2048), Path("manifests/smollm2.yaml"))
    assert said == ("smollm2-135m has a context of 2,048 tokens; claude's first prompt alone "
                    "is about 7,625 tokens: raise ctx_size in manifests/smollm2.yaml to 8192 "
                    "or more (llama.cpp divides it among the parallel slots; the model was "
                    "trained for 8,192)")


def test_without_the_file_the_manifest_is_named_by_its_id() -> None:
    said = refusal_of(AGENTS["codex"], model(4096, trained=None), None)
    assert said is not None
    assert said.endswith("raise ctx_size in the manifest with id: smollm2-135m to 5120 or "
                         "more (llama.cpp divides it among the parallel slots)")


@pytest.mark.parametrize("source", ["discovered", "pulled"])
def test_a_model_without_a_manifest_is_told_to_get_one(source: str) -> None:
    said = refusal_of(AGENTS["claude"], model(4096, trained=32768, source=source), None)
    assert said is not None and said.endswith(
        f"give it a manifest with ctx_size: 8192 (a {source} model is served with the "
        "settings' default_ctx_size; the model was trained for 32,768)")


def test_a_model_trained_short_is_not_worth_raising() -> None:
    said = refusal_of(AGENTS["claude"], model(2048, trained=2048), Path("m.yaml"))
    assert said == ("smollm2-135m has a context of 2,048 tokens; claude's first prompt alone "
                    "is about 7,625 tokens, and its GGUF was trained for 2,048: choose a model "
                    "with a longer context")


def test_find_manifest(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("id: other\n")
    (tmp_path / "broken.yaml").write_text("id: [unclosed\n")
    (tmp_path / "list.yml").write_text("- not a manifest\n")
    (tmp_path / "smol.yml").write_text("id: smollm2-135m\nctx_size: 2048\n")
    assert find_manifest("smollm2-135m", [tmp_path / "missing", tmp_path]) == \
        tmp_path / "smol.yml"
    assert find_manifest("nobody", [tmp_path]) is None
