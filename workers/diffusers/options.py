"""The worker's command line, parsed and validated into ``WorkerOptions``.

    python -m workers.diffusers --model DIR --port N [--host 127.0.0.1]
        [--device auto|cuda|cpu] [--dtype auto|float16|bfloat16|float32]
        [--offload none|model|sequential|group|balanced] [--max-memory JSON]
        [--vae-mb-per-512px 1600] [--allow-cpu-vae|--no-allow-cpu-vae]
        [--vram-margin-mb 512] [--parent-pid PID] [--api-key KEY]
        [--ip-adapter PATH [--ip-adapter-image-encoder DIR]] [--lora NAME=PATH]...

``--ip-adapter`` attaches an IP-Adapter (its weights file, or a folder holding one) so requests
may bring reference images; its image encoder is the ``image_encoder/`` folder beside it unless
``--ip-adapter-image-encoder`` names another (``references``). Each ``--lora NAME=PATH`` loads
a LoRA adapter (a ``.safetensors`` file, or a folder holding ``pytorch_lora_weights.safetensors``)
that a request turns on by its NAME (``loras``); none is on otherwise.

The API key is better given in ``WORKER_API_KEY`` (argv shows in ``ps``); without one the
worker answers anyone.

    python -m workers.diffusers --spare --port N [--host ...] [--parent-pid PID]

starts a *spare*: torch and diffusers imported, no model, until ``POST /load`` names one with
the same model flags (``load_args``), so a cold load skips the interpreter start and imports.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, replace

from ..spare import InvalidOptions, RaisingParser, refuse_owned
from .loras import parse_lora
from .memory import Offload

PROG = "python -m workers.diffusers"
API_KEY_ENV = "WORKER_API_KEY"


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """The command line, validated."""

    model: str
    port: int
    host: str = "127.0.0.1"
    device: str = "auto"
    dtype: str = "auto"
    offload: Offload = Offload.NONE
    max_memory: dict[int | str, str] | None = None
    vae_mb_per_512px: float = 1600.0
    allow_cpu_vae: bool = True
    vram_margin_mb: int = 512
    parent_pid: int | None = None
    api_key: str | None = None
    spare: bool = False
    ip_adapter: str | None = None  # an IP-Adapter weights file, or a folder holding one
    ip_adapter_image_encoder: str | None = None  # default: image_encoder/ beside the adapter
    loras: tuple[tuple[str, str], ...] = ()  # (name, path) of each --lora, in the order given


def load_args(spare: WorkerOptions, flags: list[str]) -> WorkerOptions:
    """The options a spare loads with: the model flags a cold start would get (``--model``
    and the rest), on the spare's own address, parent and key. Raises ``InvalidOptions``."""
    refuse_owned(flags, _SPARE_OWNED)
    parsed = parse_args([*flags, "--port", str(spare.port)], parser_class=RaisingParser)
    if not parsed.model:
        raise InvalidOptions("--model is required")
    return replace(parsed, host=spare.host, parent_pid=spare.parent_pid, api_key=spare.api_key)


_SPARE_OWNED = frozenset({"--port", "--host", "--parent-pid", "--api-key", "--spare"})


def parse_args(argv: list[str] | None = None,
               parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser,
               ) -> WorkerOptions:
    """Parse and validate the command line into ``WorkerOptions``."""
    parser = parser_class(prog=PROG)
    parser.add_argument("--spare", action="store_true",
                        help="import torch and diffusers, then wait for POST /load")
    parser.add_argument("--model", default="", help="a diffusers pipeline directory")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--dtype", choices=["auto", "float16", "bfloat16", "float32"],
                        default="auto")
    parser.add_argument("--offload", choices=[o.value for o in Offload], default="none")
    parser.add_argument("--max-memory", default=None,
                        help='JSON for device_map="balanced", e.g. {"0": "10GiB", "cpu": "30GiB"}')
    parser.add_argument("--vae-mb-per-512px", type=float, default=1600.0)
    parser.add_argument("--allow-cpu-vae", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--vram-margin-mb", type=int, default=512)
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument("--api-key", default=None, help=f"better: the {API_KEY_ENV} variable")
    parser.add_argument("--ip-adapter", default=None,
                        help="an IP-Adapter weights file (or a folder holding one) for "
                             "reference images")
    parser.add_argument("--ip-adapter-image-encoder", default=None,
                        help="its CLIP image encoder folder (default: image_encoder/ beside it)")
    parser.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                        help="a LoRA adapter (a .safetensors file, or a folder holding "
                             "pytorch_lora_weights.safetensors) a request turns on by NAME; "
                             "repeatable")
    args = parser.parse_args(argv)
    if not args.model and not args.spare:
        parser.error("--model is required (or --spare)")
    max_memory = None
    if args.max_memory:
        try:
            raw = json.loads(args.max_memory)
            if not isinstance(raw, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            parser.error(f"--max-memory must be a JSON object: {exc}")
        max_memory = {int(k) if str(k).isdigit() else k: str(v) for k, v in raw.items()}
    if args.ip_adapter_image_encoder and not args.ip_adapter:
        parser.error("--ip-adapter-image-encoder needs --ip-adapter")
    if args.vae_mb_per_512px <= 0:
        parser.error("--vae-mb-per-512px must be positive")
    loras = _loras(parser, args.lora)
    return WorkerOptions(
        model=args.model, port=args.port, host=args.host, device=args.device,
        dtype=args.dtype, offload=Offload(args.offload), max_memory=max_memory,
        vae_mb_per_512px=args.vae_mb_per_512px, allow_cpu_vae=args.allow_cpu_vae,
        vram_margin_mb=args.vram_margin_mb, parent_pid=args.parent_pid,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None, spare=args.spare,
        ip_adapter=args.ip_adapter or None,
        ip_adapter_image_encoder=args.ip_adapter_image_encoder or None, loras=loras)


def _loras(parser: argparse.ArgumentParser, given: list[str]) -> tuple[tuple[str, str], ...]:
    """Each ``--lora NAME=PATH`` as ``(name, path)``; a malformed one or a name given twice
    is a usage error. The files are looked at when the pipeline loads."""
    loras: list[tuple[str, str]] = []
    for text in given:
        try:
            name, path = parse_lora(text)
        except ValueError as exc:
            parser.error(f"--lora {exc}")
        if any(name == seen for seen, _ in loras):
            parser.error(f"--lora {name}: the name is given twice")
        loras.append((name, path))
    return tuple(loras)
