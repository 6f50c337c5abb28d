"""The YAML settings file: read as a mapping, its relative paths taken from its own folder."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from pydantic_settings import PydanticBaseSettingsSource

from ..errors import ConfigError

_CONFIG_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "model_boss_config_file", default=None
)
# the settings that name a path, resolved against the file's folder (manifests: each entry)
_PATH_KEYS = ("tasks_file", "models_dir", "state_dir", "prompt_cache_dir")


@contextmanager
def reading(path: Path | None) -> Iterator[None]:
    """Within the block, :class:`YamlFileSource` reads ``path`` (None: no file)."""
    token = _CONFIG_FILE.set(path)
    try:
        yield
    finally:
        _CONFIG_FILE.reset(token)


class YamlFileSource(PydanticBaseSettingsSource):
    """Reads the YAML file named by :func:`reading`; resolves its relative paths."""

    def get_field_value(self, field: Any, name: str) -> tuple[Any, str, bool]:  # unused
        return None, name, False

    def __call__(self) -> dict[str, Any]:
        path = _CONFIG_FILE.get()
        if path is None:
            return {}
        data = read_yaml_mapping(path)
        base = path.parent
        for key in _PATH_KEYS:
            if isinstance(data.get(key), str):
                data[key] = _relative_to(base, data[key])
        manifests = data.get("manifests")
        manifests = [manifests] if isinstance(manifests, str) else manifests
        if isinstance(manifests, list):
            data["manifests"] = [_relative_to(base, m) if isinstance(m, str) else m
                                 for m in manifests]
        return data


def _relative_to(base: Path, value: str) -> str:
    expanded = Path(value).expanduser()
    return str(expanded if expanded.is_absolute() else base / expanded)


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """Parse a YAML file that must hold a mapping; errors name the file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data
