"""``Settings``: every concern's group in one flat class, read from the environment and the
YAML file."""

from __future__ import annotations

from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from .catalog import CatalogSettings
from .cluster import ClusterSettings
from .core import ServerSettings
from .edge import EdgeSettings
from .media import MediaSettings
from .memory import MemorySettings
from .prompt_cache import PromptCacheSettings
from .records import RecordSettings
from .replicas import ReplicaSettings
from .scheduling import QueueSettings
from .tenancy import TenancySettings
from .tracing import TracingGroup
from .workers import WorkerSettings
from .yaml_file import YamlFileSource


# The groups are inherited, not nested: the YAML file stays one flat mapping and every
# variable keeps its MODEL_BOSS_<FIELD> name. pydantic orders the fields from the last base
# up, so they are listed last first: the core's fields come first, as in an error's lines.
class Settings(TracingGroup, RecordSettings, PromptCacheSettings, TenancySettings, MediaSettings,
               EdgeSettings, ReplicaSettings, QueueSettings, WorkerSettings, ClusterSettings,
               MemorySettings, CatalogSettings, ServerSettings, BaseSettings):
    """Everything the daemon reads at start; see docs/CONFIGURATION.md."""

    model_config = SettingsConfigDict(
        env_prefix="MODEL_BOSS_", extra="forbid", env_nested_delimiter="__"
    )

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   **_others: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, YamlFileSource(settings_cls))
