"""Daemon settings: ``MODEL_BOSS_*`` environment variables over an optional YAML file.

Precedence, highest first: keyword arguments, environment, the YAML file, defaults.
Relative paths in the YAML file are taken relative to the file's own directory.

Each concern's fields live in a module of their own (``core``, ``catalog``, ``memory``,
``cluster``, ``workers``, ``scheduling``, ``replicas``, ``media``, ``tenancy``, ``edge``,
``prompt_cache``, ``records``, ``tracing``); :class:`Settings` inherits them all, so the file
and the environment stay flat (``tracing`` is the one nested section).
"""

from .catalog import CatalogSettings
from .cluster import ClusterSettings
from .composed import Settings
from .core import ServerSettings
from .edge import LOOPBACK_ORIGINS, EdgeSettings
from .load import describe_validation_error, load_settings
from .media import MediaSettings
from .memory import DeclaredGPU, MemorySettings
from .prompt_cache import PromptCacheSettings
from .records import RecordSettings
from .replicas import ReplicaSettings
from .scheduling import QueueSettings
from .tenancy import (
    END_USER_LIMITS,
    ENDPOINT_KINDS,
    LIMITS,
    QUOTAS,
    RATES,
    ClientProfile,
    Count,
    EndpointKind,
    EndUserLimits,
    Seconds,
    TenancySettings,
)
from .tracing import TracingSettings
from .workers import DEFAULT_STAY_WARM_S, PreloadEntry, WorkerSettings
from .yaml_file import read_yaml_mapping

__all__ = [
    "DEFAULT_STAY_WARM_S", "END_USER_LIMITS", "ENDPOINT_KINDS", "LIMITS", "LOOPBACK_ORIGINS",
    "QUOTAS", "RATES", "CatalogSettings", "ClientProfile", "ClusterSettings", "Count",
    "DeclaredGPU", "EdgeSettings", "EndUserLimits", "EndpointKind", "MediaSettings",
    "MemorySettings", "PreloadEntry",
    "PromptCacheSettings", "QueueSettings", "RecordSettings", "ReplicaSettings", "Seconds",
    "ServerSettings", "Settings", "TenancySettings", "TracingSettings", "WorkerSettings",
    "describe_validation_error", "load_settings", "read_yaml_mapping",
]
