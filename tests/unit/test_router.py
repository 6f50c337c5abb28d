"""The router's chokepoint, the task registry and chat templates — pure logic."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_boss.backends.llama.chat_templates import (
    completion_body,
    completion_to_chat,
    render_alpaca,
    render_prompt,
)
from model_boss.catalog import Catalog, ModelManifest
from model_boss.catalog.tasks import TaskRegistry, task_name
from model_boss.errors import ConfigError, ModelNotFound
from model_boss.scheduling.router import Candidate, _pick_best_candidate

C = Candidate


def ids(order):
    return [c.model_id for c in order]


@pytest.mark.parametrize("candidates, pin, allow_cloud, expected, stripped", [
    # ladder order when everything is cold and placeable
    ([C("a", 0), C("b", 1)], False, True, ["a", "b"], []),
    # a warm second candidate beats a cold first one ...
    ([C("a", 0), C("b", 1, warm=True)], False, True, ["b", "a"], []),
    # ... unless the task pins its primary
    ([C("a", 0), C("b", 1, warm=True)], True, True, ["a", "b"], []),
    # an unavailable primary (missing file) goes last
    ([C("a", 0, available=False), C("b", 1)], False, True, ["b", "a"], []),
    # placeable now beats having to wait, among cold candidates
    ([C("a", 0, placeable=False), C("b", 1)], False, True, ["b", "a"], []),
    # the guard strips a cloud fallback ...
    ([C("a", 0), C("claude:x", 1, cloud=True)], False, False, ["a"], ["claude:x"]),
    # ... but never a cloud primary, so the list never empties
    ([C("claude:x", 0, cloud=True), C("claude:y", 1, cloud=True)], False, False,
     ["claude:x"], ["claude:y"]),
    # with the guard on, cloud fallbacks stay
    ([C("a", 0), C("claude:x", 1, cloud=True)], False, True, ["a", "claude:x"], []),
    # a warm cloud fallback that is stripped cannot win
    ([C("a", 0), C("claude:x", 1, cloud=True, warm=True)], False, False, ["a"],
     ["claude:x"]),
])
def test_pick_best_candidate(candidates, pin, allow_cloud, expected, stripped):
    order, removed = _pick_best_candidate(candidates, pin_first=pin,
                                          allow_cloud_fallback=allow_cloud)
    assert ids(order) == expected
    assert ids(removed) == stripped


def catalog(*names: str) -> Catalog:
    return Catalog([ModelManifest(id=n, path=f"{n}.gguf") for n in names], Path("/tmp"))


def test_task_registry_resolves_aliases_and_defaults():
    cat = Catalog([ModelManifest(id="big", aliases=["b"], path="x.gguf"),
                   ModelManifest(id="small", path="y.gguf")], Path("/tmp"))
    tasks = TaskRegistry.from_mapping({"tasks": {"chat": {
        "candidates": ["b", "small"], "keep_alive_s": 60, "pin_primary": True,
        "budget_s": 5, "priority": 2, "params": {"temperature": 0.2}}}}, cat)
    spec = tasks.get("chat")
    assert spec.candidates == ["big", "small"] and spec.params == {"temperature": 0.2}
    assert spec.pin_primary and spec.budget_s == 5 and spec.priority == 2
    with pytest.raises(ModelNotFound):
        tasks.get("nope")
    assert task_name("task:chat") == "chat" and task_name("chat") is None


@pytest.mark.parametrize("data, where", [
    ({"tasks": {"chat": {"candidates": ["ghost"]}}}, "tasks.chat.candidates.0"),
    ({"tasks": {"chat": {"candidates": []}}}, "tasks.chat: candidates"),
    ({"tasks": {"chat": {"candidates": ["a"], "budget_s": -1}}}, "budget_s"),
    ({"tasks": {"chat": {"candidates": ["a"], "colour": "red"}}}, "colour"),
    ({"tasks": {"chat": "a"}}, "tasks.chat"),
    ({"tasks": ["a"]}, "tasks"),
    ({"tasks": {}, "extra": 1}, "extra"),
])
def test_bad_tasks_file_names_file_and_field(data, where):
    with pytest.raises(ConfigError) as caught:
        TaskRegistry.from_mapping(data, catalog("a"), "/etc/tasks.yaml")
    assert "/etc/tasks.yaml" in caught.value.message and where in caught.value.message


def test_tasks_file_loaded_from_disk(tmp_path):
    path = tmp_path / "tasks.yaml"
    path.write_text("tasks:\n  t:\n    candidates: [a]\n")
    assert TaskRegistry.load(path, catalog("a")).get("t").candidates == ["a"]
    path.write_text("tasks:\n  t:\n    candidates: [zzz]\n")
    with pytest.raises(ConfigError, match=str(path)):
        TaskRegistry.load(path, catalog("a"))


def test_alpaca_template():
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": "Blue."},
                {"role": "user", "content": [{"type": "text", "text": "Another."}]}]
    assert render_alpaca(messages) == (
        "Be brief.\n\n"
        "### Instruction:\nName a colour.\n\n"
        "### Response:\nBlue.\n\n"
        "### Instruction:\nAnother.\n\n"
        "### Response:\n")


def test_thinking_off_marks_last_user_turn():
    prompt = render_prompt("raw", [{"role": "user", "content": "a"},
                                   {"role": "user", "content": "b"}], thinking=False)
    assert prompt == "a\n\nb /no_think"


def test_jinja_template_file(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                        "{% if not enable_thinking %}[nothink]{% endif %}<assistant>")
    prompt = render_prompt(str(template), [{"role": "user", "content": "hi"}], thinking=False)
    assert prompt == "<user>hi[nothink]<assistant>"


def test_completion_round_trip_shapes():
    body = completion_body({"model": "m", "messages": [], "max_tokens": 5, "stop": "x",
                            "stream": False}, "PROMPT", "alpaca")
    assert body == {"model": "m", "prompt": "PROMPT", "max_tokens": 5, "stream": False,
                    "stop": ["x", "### Instruction:"]}
    chat = completion_to_chat({"id": "cmpl-1", "created": 3, "model": "m", "usage": {},
                               "choices": [{"text": "hi", "index": 0,
                                            "finish_reason": "stop"}]})
    assert chat["object"] == "chat.completion" and chat["id"] == "chatcmpl-1"
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "hi"}
