"""GPUs: inventory, the VRAM lease coordinator and its stores."""

from .boss import GPUBoss
from .embedded_store import EmbeddedLeaseStore
from .inventory import GPUInfo, GPUUsage, NvmlProbe, discover_gpus, open_nvml
from .lease import Lease, LeaseStore

__all__ = [
    "EmbeddedLeaseStore",
    "GPUBoss",
    "GPUInfo",
    "GPUUsage",
    "Lease",
    "LeaseStore",
    "NvmlProbe",
    "discover_gpus",
    "open_nvml",
]
