"""The worker's command line, validated into ``WorkerOptions``.

    python -m workers.transformers --model DIR --task embedding|rerank|stt|tts --port N
        [--host 127.0.0.1] [--device auto|cuda|cpu] [--dtype auto|float16|bfloat16|float32]
        [--batch-size 32] [--max-batch-wait-ms 5] [--max-items 2048] [--parent-pid PID]
        [--gpu-layers N [--no-offload-prefetch]]
    python -m workers.transformers --spare --port N [--host ...] [--parent-pid PID]

``--spare`` starts a *spare*: torch, transformers and sentence-transformers imported, no
model, until ``POST /load`` names one with the model flags a cold start would get.

The API key comes in ``WORKER_API_KEY`` (argv shows in ``ps``); without one the worker
answers anyone.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, replace

from ..spare import InvalidOptions, RaisingParser, refuse_owned

PROG = "python -m workers.transformers"
API_KEY_ENV = "WORKER_API_KEY"
TASKS = ("embedding", "rerank", "stt", "tts")


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    model: str | None
    task: str | None
    port: int
    host: str = "127.0.0.1"
    device: str = "auto"
    dtype: str = "auto"
    batch_size: int = 32
    max_batch_wait_ms: float = 5.0
    max_items: int = 2048  # texts (or documents) in one request
    parent_pid: int | None = None
    api_key: str | None = None
    spare: bool = False
    # the model's repeated blocks kept on the device, the rest streamed (layers.py); None: all
    gpu_layers: int | None = None
    offload_prefetch: bool = True


_SPARE_OWNED = frozenset({"--port", "--host", "--parent-pid", "--spare"})


def load_args(spare: WorkerOptions, flags: list[str]) -> WorkerOptions:
    """The options a spare loads with: a cold start's model flags, on the spare's own
    address, parent and key. Raises ``InvalidOptions``."""
    refuse_owned(flags, _SPARE_OWNED)
    parsed = parse_args([*flags, "--port", str(spare.port)], parser_class=RaisingParser)
    if not parsed.model or not parsed.task:
        raise InvalidOptions("--model and --task are required")
    return replace(parsed, host=spare.host, parent_pid=spare.parent_pid, api_key=spare.api_key)


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value
    return parse


def parse_args(argv: list[str] | None = None,
               parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser
               ) -> WorkerOptions:
    parser = parser_class(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--task", choices=TASKS)
    parser.add_argument("--spare", action="store_true",
                        help="start with no model; POST /load names one")
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    parser.add_argument("--dtype", default="auto",
                        choices=("auto", "float16", "bfloat16", "float32"))
    parser.add_argument("--batch-size", type=_positive(int), default=32)
    parser.add_argument("--max-batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--max-items", type=_positive(int), default=2048)
    parser.add_argument("--parent-pid", type=int)
    parser.add_argument("--gpu-layers", type=int, default=None,
                        help="repeated blocks kept on the device, the rest streamed from "
                             "CPU RAM (-1: all)")
    parser.add_argument("--no-offload-prefetch", dest="offload_prefetch",
                        action="store_false",
                        help="streamed blocks are copied when used, not one ahead")
    args = parser.parse_args(argv)
    if args.gpu_layers is not None and args.gpu_layers < -1:
        parser.error("--gpu-layers: must be -1 (all) or more")
    if args.max_batch_wait_ms < 0:
        parser.error("--max-batch-wait-ms: must be 0 or more")
    if not args.spare and not (args.model and args.task):
        parser.error("--model and --task are required (or --spare)")
    return WorkerOptions(model=args.model, task=args.task, port=args.port, host=args.host,
                         device=args.device, dtype=args.dtype, batch_size=args.batch_size,
                         max_batch_wait_ms=args.max_batch_wait_ms, max_items=args.max_items,
                         parent_pid=args.parent_pid,
                         api_key=os.environ.get(API_KEY_ENV) or None, spare=args.spare,
                         gpu_layers=args.gpu_layers, offload_prefetch=args.offload_prefetch)
