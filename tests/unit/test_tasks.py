"""tasks.yaml: the default task a request without a model goes to."""

from __future__ import annotations

import pytest

from model_boss.catalog import Catalog, ModelManifest
from model_boss.catalog.tasks import TaskRegistry
from model_boss.errors import ConfigError


@pytest.fixture
def catalog(tmp_path) -> Catalog:
    weights = tmp_path / "w.gguf"
    weights.write_bytes(b"GGUF")
    return Catalog([ModelManifest(id=name, path=str(weights)) for name in ("a", "b")],
                   tmp_path)


def test_default_task_names_a_task(catalog):
    tasks = TaskRegistry.from_mapping({"default_task": "chat", "tasks": {
        "chat": {"candidates": ["a"]}, "code": {"candidates": ["b"]}}}, catalog)
    assert tasks.default_task == "chat"
    listed = {t["name"]: t["default"] for t in tasks.to_list()}
    assert listed == {"chat": True, "code": False}


def test_without_default_task_there_is_none(catalog):
    tasks = TaskRegistry.from_mapping({"tasks": {"chat": {"candidates": ["a"]}}}, catalog)
    assert tasks.default_task is None
    assert TaskRegistry.empty().default_task is None


@pytest.mark.parametrize("default", ["chit-chat", 3, ["chat"]])
def test_a_default_task_that_is_not_a_task_is_a_config_error(catalog, default):
    with pytest.raises(ConfigError) as error:
        TaskRegistry.from_mapping({"default_task": default,
                                   "tasks": {"chat": {"candidates": ["a"]}}}, catalog,
                                  "tasks.yaml")
    assert error.value.message.startswith("tasks.yaml: default_task:")
    assert "chat" in error.value.message  # says which tasks there are


def test_unknown_top_level_keys_name_both_known_ones(catalog):
    with pytest.raises(ConfigError, match="'tasks' or 'default_task'"):
        TaskRegistry.from_mapping({"tasks": {}, "defaults": "chat"}, catalog)
