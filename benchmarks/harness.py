"""What the benchmarks share, and the rule they keep: a benchmark owns its settings.

The process plumbing (start a coordinator from a config file, wait, pick a free port) comes
from the test suite; no setting of the suite's does. :class:`BenchServer` starts a coordinator
with only what a benchmark passes (plus its address and folders), the demo model's manifest
is built here with every figure-changing field explicit, each side of a comparison is printed
with its table, and :func:`same_except` stops a run whose two sides differ in anything but
the one thing it measures.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.conftest import DEMO_GGUF, ServerProcess, free_port, wait_for, worker_health

__all__ = ["DEFAULT_THREADS", "DEMO_GGUF", "BenchServer", "check_sides", "coordinator_side",
           "demo_manifest", "free_port", "llama_flags", "print_sides", "same_except",
           "wait_for", "worker_argv", "worker_health", "worker_process"]

# llama.cpp's own default: one thread per core it counts; said out loud so both sides of a
# comparison can be given the same number, and printed
DEFAULT_THREADS = os.cpu_count() or 1
# the llama-server flags that change a figure (what a side runs with, when it is compared)
PERFORMANCE_FLAGS = ("--model", "--ctx-size", "--parallel", "--threads", "--threads-batch",
                     "--batch-size", "--ubatch-size", "--n-gpu-layers", "--flash-attn",
                     "--cache-type-k", "--cache-type-v", "--cont-batching")
# a coordinator's settings that say where it runs, not how: left out of its side
WHERE = ("host", "port", "manifests", "state_dir")


class BenchServer(ServerProcess):
    """A coordinator started with the benchmark's settings and no test tuning."""

    TUNING: dict = {}


def demo_manifest(model_id: str, *, threads: int, ctx_size: int, parallel: int = 1,
                  gguf: Path = DEMO_GGUF, **extra: Any) -> dict:
    """The demo GGUF as a model-boss manifest, with the fields that change a figure given."""
    return {"id": model_id, "category": "llm", "backend": "llama-server", "path": str(gguf),
            "threads": threads, "ctx_size": ctx_size, "parallel": parallel, **extra}


def llama_flags(argv: Iterable[str]) -> dict[str, str]:
    """The figure-changing flags of a llama.cpp server's command line (``--flag value``, or
    ``--flag`` alone as "on"); the model as its resolved path."""
    args = list(argv)
    flags: dict[str, str] = {}
    for i, arg in enumerate(args):
        if arg in PERFORMANCE_FLAGS:
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") \
                else "on"
            flags[arg] = str(Path(value).resolve()) if arg == "--model" else value
    return flags


def worker_process(server: ServerProcess, model_id: str) -> psutil.Process:
    """The coordinator's llama.cpp worker for ``model_id``."""
    assert server.proc is not None
    for child in psutil.Process(server.proc.pid).children(recursive=True):
        cmdline = child.cmdline()
        if "--alias" in cmdline and cmdline[cmdline.index("--alias") + 1] == model_id:
            return child
    raise RuntimeError(f"no worker for '{model_id}' under the coordinator")


def worker_argv(server: ServerProcess, model_id: str) -> list[str]:
    """The command line of the coordinator's llama.cpp worker for ``model_id`` (what
    model-boss really started, not what its manifest asked for)."""
    return worker_process(server, model_id).cmdline()


def same_except(sides: Mapping[str, Mapping[str, Any]], measured: Iterable[str] = ()) -> None:
    """Stop the run (SystemExit) when the sides differ in a setting other than ``measured``."""
    names = list(sides)
    keys = {k for side in sides.values() for k in side} - set(measured)
    differing = {k: {n: sides[n].get(k, "(default)") for n in names} for k in sorted(keys)
                 if len({str(sides[n].get(k, "(default)")) for n in names}) > 1}
    if differing:
        lines = "\n".join(f"  {k}: {v}" for k, v in differing.items())
        raise SystemExit(f"the sides compared differ in more than what is measured:\n{lines}")


def print_sides(sides: Mapping[str, Mapping[str, Any]], sep: str = " ") -> None:
    """Each side's configuration, one line a side."""
    for name, settings in sides.items():
        shown = " ".join(f"{k}{sep}{v}" for k, v in sorted(settings.items()))
        print(f"  {name}: {shown}", flush=True)


def check_sides(sides: Mapping[str, Mapping[str, Any]], measured: Iterable[str] = (),
                title: str = "sides compared") -> None:
    """Print each side's configuration (before the table), then :func:`same_except`."""
    measured = list(measured)
    print(f"{title}, differing only in {', '.join(measured) or 'nothing'}:", flush=True)
    print_sides(sides, sep="=")
    same_except(sides, measured)


def coordinator_side(server: ServerProcess, **more: Any) -> dict[str, Any]:
    """What a coordinator was really given, as one flat side: its config file's settings
    (less where it listens and keeps state; each GPU as its memory), every field of every
    manifest it loads (as ``id.field``) and the checkout whose code it runs."""
    settings = yaml.safe_load(server.config_path.read_text())
    side: dict[str, Any] = {k: v for k, v in settings.items() if k not in WHERE}
    if "gpus" in side:
        side["gpus"] = "+".join(f"{gpu.get('vram_mb')}MB" for gpu in side["gpus"])
    for path in sorted((server.workdir / "manifests").glob("*.yaml")):
        manifest = yaml.safe_load(path.read_text())
        side.update({f"{manifest['id']}.{k}": v for k, v in manifest.items() if k != "id"})
    return {**side, "code": str(server.checkout), **more}
