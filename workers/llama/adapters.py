"""Weights beside the model: LoRA adapters and a draft model, under ``llama-server``'s flags.

    [--lora FILE[,FILE...]]... [--lora-scaled FILE:SCALE[,...] | --lora-scaled FILE SCALE]...
    [--lora-init-without-apply]
    [--model-draft FILE] [--draft-max N] [--draft-min N] [--draft-p-min P]
    [--gpu-layers-draft N]

Every adapter is loaded at start, in the order given (its position is the ``id`` a request
names). ``--lora`` applies one at scale 1, ``--lora-scaled`` at its own scale; with
``--lora-init-without-apply`` all are loaded at scale 0, so the model answers as the base does
until a request says ``"lora": [{"id": N, "scale": S}]`` (llama.cpp's own field; the adapters
a request leaves out are at scale 0 for it). ``GET /lora-adapters`` lists them.

llama.cpp keys its prompt caches by tokens alone, not by the adapters the KV was computed
under. Its RAM cache brings a prompt back under another adapter (a prompt sent at scale 0,
another prompt, then the first at scale 1: answered from the scale-0 KV), so with any adapter
loaded that cache is off here (``--cache-ram`` 0), whatever the flag said. Each slot still
reuses its own prefix and checks an adapter change against it, but only for a request that
has a ``"lora"`` list: one without (or with ``[]``) takes the slot's KV as it is, perhaps
computed under an adapter. A caller that switches adapters names them on every request, the
base as every adapter at scale 0.

A draft model drafts tokens the model then checks (llama.cpp's speculative decoding, of the
``draft-simple`` kind); a greedy answer is the same with or without one. The draft takes the
model's context size: this llama.cpp build has no separate one (no ``--ctx-size-draft``). The
server counts what was drafted and kept: a completion's ``timings.draft_n`` and
``timings.draft_n_accepted``, and ``/metrics``' ``llamacpp:spec_decode_num_draft_tokens_total``
and ``llamacpp:spec_decode_num_accepted_tokens_total``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """One adapter file and the scale it starts at."""

    path: str
    scale: float = 1.0


@dataclass(frozen=True, slots=True)
class DraftModel:
    """A draft model and how far it drafts (None: llama.cpp's own default)."""

    path: str
    n_max: int | None = None  # the most tokens drafted at a step
    n_min: int | None = None  # the fewest worth checking
    p_min: float | None = None  # a drafted token's least probability to go on drafting
    n_gpu_layers: int | None = None  # the draft's layers on the GPU (-1: all)
    threads: int | None = None  # the model's --threads


def _files(text: str) -> list[str]:
    """``--lora A,B``: llama-server takes a comma-separated list as several adapters."""
    return [part for part in text.split(",") if part]


def _scaled(values: list[str]) -> list[LoraAdapter]:
    """``FILE:SCALE[,FILE:SCALE...]`` (llama-server's form now) or ``FILE SCALE`` (its older
    form, two words)."""
    if len(values) == 2 and ":" not in values[1]:
        return [LoraAdapter(values[0], _scale(values[1]))]
    if len(values) != 1:
        raise argparse.ArgumentTypeError(
            f"--lora-scaled takes FILE:SCALE[,...] or FILE SCALE, not {' '.join(values)!r}")
    adapters = []
    for part in _files(values[0]):
        path, colon, scale = part.rpartition(":")
        if not colon or not path:
            raise argparse.ArgumentTypeError(f"--lora-scaled wants FILE:SCALE, not {part!r}")
        adapters.append(LoraAdapter(path, _scale(scale)))
    return adapters


def _scale(text: str) -> float:
    try:
        return float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a LoRA scale: {text!r}") from exc


class _Adapters(argparse.Action):
    """``--lora`` and ``--lora-scaled`` append to one list, so the ids follow the order the
    flags were given in, whichever flag named the file."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        found = list(getattr(namespace, self.dest) or [])
        try:
            if option_string == "--lora-scaled":
                found += _scaled(list(values))
            else:
                found += [LoraAdapter(path) for path in _files(values)]
        except argparse.ArgumentTypeError as exc:
            parser.error(str(exc))
        setattr(namespace, self.dest, found)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The adapter and draft flags, under llama-server's names and aliases."""
    parser.add_argument("--lora", dest="lora", action=_Adapters, default=[], metavar="FILE")
    parser.add_argument("--lora-scaled", dest="lora", action=_Adapters, nargs="+",
                        metavar="FILE:SCALE")
    parser.add_argument("--lora-init-without-apply", action="store_true")
    parser.add_argument("-md", "--model-draft", "--spec-draft-model", dest="draft_model",
                        default=None, metavar="FILE")
    parser.add_argument("--draft-max", "--draft", "--draft-n", "--spec-draft-n-max",
                        dest="draft_max", type=int, default=None)
    parser.add_argument("--draft-min", "--draft-n-min", "--spec-draft-n-min",
                        dest="draft_min", type=int, default=None)
    parser.add_argument("--draft-p-min", "--spec-draft-p-min", dest="draft_p_min",
                        type=float, default=None)
    parser.add_argument("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft",
                        "--spec-draft-ngl", dest="draft_gpu_layers", type=int, default=None)


def from_args(parser: argparse.ArgumentParser,
              args: argparse.Namespace) -> tuple[tuple[LoraAdapter, ...], DraftModel | None]:
    """The adapters and the draft model the parsed flags name; a draft setting without a
    draft model is an error (it would be silently ignored). The draft runs on the model's
    threads, and on the CPU where the model does (``--n-gpu-layers 0``) unless
    ``--gpu-layers-draft`` says otherwise: the coordinator gave it no GPU."""
    tuning = {"n_max": args.draft_max, "n_min": args.draft_min, "p_min": args.draft_p_min,
              "n_gpu_layers": args.draft_gpu_layers}
    if args.draft_model is None:
        if any(value is not None for value in tuning.values()):
            parser.error("--draft-max, --draft-min, --draft-p-min and --gpu-layers-draft "
                         "need --model-draft")
        draft = None
    else:
        if tuning["n_gpu_layers"] is None and args.n_gpu_layers == 0:
            tuning["n_gpu_layers"] = 0  # no GPU for the model: none for its draft either
        draft = DraftModel(args.draft_model, threads=args.threads, **tuning)
    if draft and draft.n_max is not None and draft.n_min is not None \
            and draft.n_min > draft.n_max:
        parser.error("--draft-min is more than --draft-max")
    return tuple(args.lora), draft


def apply(p: Any, adapters: tuple[LoraAdapter, ...], init_without_apply: bool,
          draft: DraftModel | None) -> None:
    """Set them on ``p``, an ``xllamacpp.CommonParams``."""
    import xllamacpp as xl

    # llama.cpp's flag only skips applying them to its first context; its server still starts
    # every slot at the adapters' scales, so "without apply" is scale 0 here, as documented
    p.lora_adapters = [xl.CommonAdapterLoraInfo(a.path, 0.0 if init_without_apply else a.scale)
                       for a in adapters]
    p.lora_init_without_apply = init_without_apply
    if adapters:
        p.cache_ram_mib = 0  # its entries do not say under which adapters they were computed
    if draft is None:
        return
    spec = p.speculative.draft
    spec.mparams.path = draft.path
    # llama-server's own parser turns a draft model on by this type; xllamacpp's params skip it
    p.speculative.types = [xl.common_speculative_type.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]
    for field in ("n_max", "n_min", "p_min", "n_gpu_layers"):
        if (value := getattr(draft, field)) is not None:
            setattr(spec, field, value)
    if draft.threads:
        spec.cpuparams.n_threads = draft.threads
        spec.cpuparams_batch.n_threads = draft.threads
