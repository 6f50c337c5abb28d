"""TaskRegistry: tasks.yaml — a task names a ladder of candidate models and its defaults;
``default_task:`` names the task a request without a model goes to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ConfigError, ModelNotFound
from ..settings import describe_validation_error, read_yaml_mapping
from .catalog import Catalog

TASK_PREFIX = "task:"


class TaskSpec(BaseModel):
    """One task: candidates in order of preference plus scheduling defaults."""

    model_config = ConfigDict(extra="forbid")

    name: str = ""
    candidates: list[str] = Field(min_length=1)
    keep_alive_s: float | None = Field(default=None, ge=-1)
    pin_primary: bool = False
    budget_s: float | None = Field(default=None, gt=0)
    priority: int | None = Field(default=None, ge=0, le=100)
    share: float = Field(default=1.0, gt=0)  # weight of a client's requests in fair share
    params: dict[str, Any] = Field(default_factory=dict)


class TaskRegistry:
    """Tasks by name, every candidate checked against the catalog at load time, and the
    default task (``None``: a request must name its model)."""

    def __init__(self, tasks: dict[str, TaskSpec], default_task: str | None = None) -> None:
        if default_task is not None and default_task not in tasks:
            raise ConfigError(f"default_task: unknown task '{default_task}'")
        self.tasks = tasks
        self.default_task = default_task

    @classmethod
    def empty(cls) -> TaskRegistry:
        return cls({})

    @classmethod
    def from_mapping(cls, data: dict[str, Any], catalog: Catalog,
                     source: str = "tasks.yaml") -> TaskRegistry:
        raw = data.get("tasks", {}) if isinstance(data, dict) else None
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: tasks: expected a mapping of task name to task")
        extra = set(data) - {"tasks", "default_task"}
        if extra:
            raise ConfigError(f"{source}: {sorted(extra)[0]}: unknown top-level key "
                              "(expected 'tasks' or 'default_task')")
        default = data.get("default_task")
        if default is not None and (not isinstance(default, str) or default not in raw):
            raise ConfigError(f"{source}: default_task: {default!r} is not a task in this file "
                              f"(tasks: {', '.join(map(str, raw)) or 'none'})")
        tasks: dict[str, TaskSpec] = {}
        for name, body in raw.items():
            if not isinstance(body, dict):
                raise ConfigError(f"{source}: tasks.{name}: expected a mapping")
            try:
                spec = TaskSpec.model_validate({**body, "name": str(name)})
            except ValidationError as exc:
                raise ConfigError(describe_validation_error(f"{source}: tasks.{name}", exc)) \
                    from exc
            resolved = []
            for position, candidate in enumerate(spec.candidates):
                entry = catalog.find(candidate)
                if entry is None:
                    raise ConfigError(f"{source}: tasks.{name}.candidates.{position}: "
                                      f"unknown model '{candidate}'")
                resolved.append(entry.manifest.id)
            spec.candidates = resolved
            tasks[str(name)] = spec
        return cls(tasks, default)

    @classmethod
    def load(cls, path: Path | None, catalog: Catalog) -> TaskRegistry:
        if path is None:
            return cls.empty()
        path = path.expanduser()
        if not path.exists():
            return cls.empty()
        return cls.from_mapping(read_yaml_mapping(path), catalog, str(path))

    def adopt(self, other: TaskRegistry) -> None:
        """Take ``other``'s tasks in one step (a reload)."""
        self.tasks, self.default_task = other.tasks, other.default_task

    def get(self, name: str) -> TaskSpec:
        spec = self.tasks.get(name)
        if spec is None:
            raise ModelNotFound(f"The task '{name}' does not exist", param="model",
                                code="task_not_found")
        return spec

    def __contains__(self, name: str) -> bool:
        return name in self.tasks

    def to_list(self) -> list[dict[str, Any]]:
        return [{**spec.model_dump(), "default": name == self.default_task}
                for name, spec in self.tasks.items()]


def task_name(model: str | None) -> str | None:
    """``"task:chat"`` → ``"chat"``; anything else → None."""
    if model and model.startswith(TASK_PREFIX):
        return model[len(TASK_PREFIX):]
    return None
