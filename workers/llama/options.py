"""The worker's command line (``llama-server``'s own flag names) and its ``CommonParams``.

    python -m workers.llama --model FILE --port N [--host 127.0.0.1] [--ctx-size 2048]
        [--n-gpu-layers N] [--tensor-split 0.4,0.6] [--main-gpu 0] [--threads N]
        [--parallel N] [--chat-template NAME | --chat-template-file FILE]
        [--flash-attn on|off|auto] [--cache-type-k f16] [--cache-type-v f16]
        [--embeddings] [--pooling mean] [--reranking] [--alias NAME] [--metrics] [--parent-pid PID]
        [--slot-save-path DIR] [--cache-ram MiB] [--fit-only]
        [--temp T] [--top-k N] [--top-p P] [--min-p P] [--seed N] [--repeat-penalty R]
        [--presence-penalty P] [--frequency-penalty P]
        [--lora FILE]... [--lora-scaled FILE:SCALE]... [--lora-init-without-apply]
        [--model-draft FILE [--draft-max N] [--draft-min N] [--draft-p-min P]
         [--gpu-layers-draft N]]

The LoRA and draft flags are ``adapters``'s (what a request's ``"lora"`` field does there).

The sampling flags are llama-server's: the defaults of a request that does not set its own
(a manifest's ``args: ["--temp", "0"]`` makes a model greedy unless a request asks otherwise).

The API key comes from ``LLAMA_API_KEY`` (``--api-key`` is accepted too, but shows in ``ps``).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

from . import adapters
from .adapters import DraftModel, LoraAdapter

PROG = "python -m workers.llama"
API_KEY_ENV = "LLAMA_API_KEY"
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
FLASH_ATTN = ("on", "off", "auto")
POOLING = ("none", "mean", "cls", "last", "rank")
# llama-server's sampling flags → the fields of llama.cpp's sampling parameters they set
SAMPLING = {"temp": ("--temp", "--temperature"), "top_k": ("--top-k",),
            "top_p": ("--top-p",), "min_p": ("--min-p",), "seed": ("-s", "--seed"),
            "penalty_repeat": ("--repeat-penalty",), "penalty_present": ("--presence-penalty",),
            "penalty_freq": ("--frequency-penalty",)}
_WHOLE = {"top_k", "seed"}  # the fields that take whole numbers


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """The command line, validated."""

    model: str
    port: int
    host: str = "127.0.0.1"
    ctx_size: int = 0  # 0: the model's own; shared by all slots
    n_gpu_layers: int = -1  # -1: all
    tensor_split: tuple[float, ...] = ()
    main_gpu: int = 0
    threads: int | None = None
    parallel: int = 1
    chat_template: str | None = None
    chat_template_file: str | None = None
    flash_attn: str = "auto"
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    embeddings: bool = False
    pooling: str | None = None  # None: the model's own
    reranking: bool = False
    mmproj: str | None = None  # a vision projector GGUF
    alias: str | None = None
    metrics: bool = False
    api_key: str | None = None
    parent_pid: int | None = None
    fit_only: bool = False  # print llama.cpp's memory projection and exit (``fit``)
    slot_save_path: str | None = None  # where POST /slots/{id}?action=save|restore files live
    cache_ram_mib: int | None = None  # llama.cpp's host-RAM prompt cache (None: its default)
    # the sampling defaults the flags set, as (llama.cpp's field, value)
    sampling: tuple[tuple[str, float], ...] = ()
    lora: tuple[LoraAdapter, ...] = ()  # loaded at start; a request names one by its place
    lora_init_without_apply: bool = False  # every adapter at scale 0 until a request asks
    draft: DraftModel | None = None  # speculative decoding's draft model


def _split(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.replace("/", ",").split(",") if part)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from exc


def parse_args(argv: list[str] | None = None) -> WorkerOptions:
    """Parse and validate the command line; unknown flags are an error (exit status 2)."""
    parser = argparse.ArgumentParser(prog=PROG)
    parser.add_argument("-m", "--model", required=True, help="a GGUF file")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("-c", "--ctx-size", type=int, default=0)
    parser.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", type=int, default=-1)
    parser.add_argument("-ts", "--tensor-split", type=_split, default=())
    parser.add_argument("-mg", "--main-gpu", type=int, default=0)
    parser.add_argument("-t", "--threads", type=int, default=None)
    parser.add_argument("-np", "--parallel", type=int, default=1)
    parser.add_argument("--chat-template", default=None)
    parser.add_argument("--chat-template-file", default=None)
    parser.add_argument("-fa", "--flash-attn", choices=FLASH_ATTN, default="auto")
    parser.add_argument("-ctk", "--cache-type-k", choices=CACHE_TYPES, default="f16")
    parser.add_argument("-ctv", "--cache-type-v", choices=CACHE_TYPES, default="f16")
    parser.add_argument("--embeddings", "--embedding", action="store_true")
    parser.add_argument("--pooling", choices=POOLING, default=None)
    parser.add_argument("--reranking", "--rerank", action="store_true")
    parser.add_argument("-mm", "--mmproj", default=None, help="a vision projector GGUF")
    parser.add_argument("-a", "--alias", default=None)
    parser.add_argument("--metrics", action="store_true")
    parser.add_argument("--api-key", default=None, help=f"better: the {API_KEY_ENV} variable")
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument("--slot-save-path", default=None)
    parser.add_argument("-cram", "--cache-ram", type=int, default=None)
    parser.add_argument("--fit-only", action="store_true",
                        help="print llama.cpp's memory projection for these flags and exit")
    for field, flags in SAMPLING.items():
        parser.add_argument(*flags, dest=f"sampling_{field}", default=None,
                            type=int if field in _WHOLE else float)
    adapters.add_flags(parser)
    args = parser.parse_args(argv)
    lora, draft = adapters.from_args(parser, args)
    if args.parallel < 1:
        parser.error("--parallel must be at least 1")
    if args.chat_template and args.chat_template_file:
        parser.error("--chat-template and --chat-template-file exclude each other")
    return WorkerOptions(
        model=args.model, port=args.port, host=args.host, ctx_size=args.ctx_size,
        n_gpu_layers=args.n_gpu_layers, tensor_split=args.tensor_split,
        main_gpu=args.main_gpu, threads=args.threads, parallel=args.parallel,
        chat_template=args.chat_template, chat_template_file=args.chat_template_file,
        flash_attn=args.flash_attn, cache_type_k=args.cache_type_k,
        cache_type_v=args.cache_type_v, embeddings=args.embeddings, pooling=args.pooling,
        reranking=args.reranking, mmproj=args.mmproj,
        alias=args.alias, metrics=args.metrics,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        parent_pid=args.parent_pid, fit_only=args.fit_only,
        slot_save_path=args.slot_save_path, cache_ram_mib=args.cache_ram,
        sampling=tuple((field, value) for field in SAMPLING
                       if (value := getattr(args, f"sampling_{field}")) is not None),
        lora=lora, lora_init_without_apply=args.lora_init_without_apply, draft=draft)


def to_params(options: WorkerOptions) -> Any:
    """The ``xllamacpp.CommonParams`` that serve ``options`` (imported here: a parse error
    needs no llama.cpp)."""
    import xllamacpp as xl

    p = xl.CommonParams()
    p.model.path = options.model
    p.hostnames = [options.host]
    p.port = options.port
    p.n_ctx = options.ctx_size
    p.n_parallel = options.parallel
    p.n_gpu_layers = options.n_gpu_layers
    p.main_gpu = options.main_gpu
    if options.tensor_split:
        split = list(options.tensor_split)
        p.tensor_split = split + [0.0] * (len(p.tensor_split) - len(split))
    if options.threads:
        p.cpuparams.n_threads = options.threads
        p.cpuparams_batch.n_threads = options.threads
    if options.chat_template_file:
        with open(options.chat_template_file, encoding="utf-8") as handle:
            p.chat_template = handle.read()
    elif options.chat_template:
        p.chat_template = options.chat_template
    p.flash_attn_type = {
        "on": xl.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_ENABLED,
        "off": xl.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_DISABLED,
        "auto": xl.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_AUTO}[options.flash_attn]
    p.cache_type_k = getattr(xl.ggml_type, f"GGML_TYPE_{options.cache_type_k.upper()}")
    p.cache_type_v = getattr(xl.ggml_type, f"GGML_TYPE_{options.cache_type_v.upper()}")
    if options.mmproj:
        p.mmproj.path = options.mmproj
    if options.embeddings or options.reranking:
        p.embedding = True
    pooling = "rank" if options.reranking else options.pooling
    if pooling:
        p.pooling_type = getattr(xl.llama_pooling_type, f"LLAMA_POOLING_TYPE_{pooling.upper()}")
    if options.alias:
        p.model_alias = {options.alias}
    if options.api_key:
        p.api_keys = [options.api_key]
    p.endpoint_metrics = options.metrics
    p.endpoint_slots = True
    if options.slot_save_path:
        p.slot_save_path = options.slot_save_path.rstrip("/") + "/"
    if options.cache_ram_mib is not None:
        p.cache_ram_mib = options.cache_ram_mib
    for field, value in options.sampling:
        setattr(p.sampling, field, value)
    adapters.apply(p, options.lora, options.lora_init_without_apply, options.draft)
    p.ui = False
    # the coordinator places the model (layers, split, context); llama.cpp must not re-fit it
    p.fit_params = False
    return p
