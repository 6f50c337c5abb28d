"""Loading ``Settings``: the file named by argument or ``MODEL_BOSS_CONFIG``, under the
environment; every error names the file (or the environment) and the field."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from ..errors import ConfigError
from .composed import Settings
from .yaml_file import reading


def describe_validation_error(source: str, exc: ValidationError) -> str:
    """One line per problem: ``file: field.path: message``."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(part) for part in err["loc"]) or "(top level)"
        lines.append(f"{source}: {loc}: {err['msg']}")
    return "; ".join(lines)


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build Settings from env + the YAML file (argument, else ``MODEL_BOSS_CONFIG``)."""
    raw = config_file or os.environ.get("MODEL_BOSS_CONFIG") or None
    path = Path(raw).expanduser() if raw else None
    if path is not None and not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    with reading(path):
        try:
            return Settings(**overrides)
        except ValidationError as exc:
            source = str(path) if path else "settings (MODEL_BOSS_* environment)"
            raise ConfigError(describe_validation_error(source, exc)) from exc
        except SettingsError as exc:  # a MODEL_BOSS_* variable that cannot be parsed
            raise ConfigError(f"MODEL_BOSS_* environment: {exc}") from exc
