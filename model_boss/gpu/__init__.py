"""GPUs: inventory, the VRAM lease coordinator and its stores."""

from .boss import GPUBoss
from .context_fit import ContextFitter, context_fitter
from .embedded_store import EmbeddedLeaseStore
from .inventory import GPUInfo, GPUUsage, NvmlProbe, discover_gpus, open_nvml
from .lease import Lease, LeaseStore

__all__ = [
    "ContextFitter",
    "EmbeddedLeaseStore",
    "GPUBoss",
    "GPUInfo",
    "GPUUsage",
    "Lease",
    "LeaseStore",
    "NvmlProbe",
    "context_fitter",
    "discover_gpus",
    "open_nvml",
]
