"""LoRA adapters: loaded at start by name (``--lora NAME=PATH``), inactive until a request
names one, then on for that generation only.

Loading: PATH is a diffusers / peft LoRA ``.safetensors`` file, or a folder holding
``pytorch_lora_weights.safetensors`` (what ``save_lora_weights`` writes). Each goes in with
``load_lora_weights(..., adapter_name=NAME)`` from local files right after ``from_pretrained``
and before the weights are placed, so its layers move with the pipeline between VRAM and CPU
RAM and count in its footprint. Then every LoRA layer is switched off (``disable_lora``): a
request that names no adapter gets the base model's images, bit for bit.

Per request: ``applied`` switches the LoRA layers on with only the asked adapter active, at the
asked scale, and off again however the generation ends (an answer, a failure, a cancel).
Callers hold the weights lock, so no other generation ever runs with it. The layers sit in the
pipeline's own UNet (or transformer) and text encoders, which the edit pipelines share
(``from_pipe``): setting them on the loaded pipeline serves generations and edits alike.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import InvalidRequest

log = logging.getLogger(__name__)

LORA_FILE = "pytorch_lora_weights.safetensors"  # the name diffusers saves a LoRA under
# peft keeps each adapter under its name in a ModuleDict: no dots, nothing odd
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def parse_lora(text: str) -> tuple[str, str]:
    """``NAME=PATH`` as ``(name, path)``; ``ValueError`` saying what is wrong."""
    name, sep, path = text.partition("=")
    if not sep or not path:
        raise ValueError(f"{text!r} is not NAME=PATH")
    if not NAME_PATTERN.match(name):
        raise ValueError(f"{name!r}: a LoRA name is 1-64 letters, digits, '_' or '-'")
    return name, path


def lora_file(name: str, path: str) -> Path:
    """The weights file ``--lora NAME=PATH`` names: the file itself, or the folder's
    ``pytorch_lora_weights.safetensors`` (else its only ``*.safetensors``); ``OSError``
    naming the flag when there is none."""
    given = Path(path)
    if given.is_file():
        return given
    if not given.is_dir():
        raise OSError(f"--lora {name}={path}: no such file or folder")
    if (given / LORA_FILE).is_file():
        return given / LORA_FILE
    found = sorted(p.name for p in given.glob("*.safetensors") if p.is_file())
    if len(found) != 1:
        raise OSError(f"--lora {name}={path}: no {LORA_FILE} in the folder, and "
                      f"{len(found) or 'no'} other *.safetensors files; name the file")
    return given / found[0]


def attach_loras(pipe: Any, loras: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """Load each ``(name, path)`` into ``pipe`` as the adapter ``name`` (local files only),
    then switch every LoRA layer off. Returns the names, in the order given. ``OSError``
    naming the flag and the file when one cannot be loaded or fits no layer of the pipeline."""
    if not loras:
        return ()
    from diffusers.loaders.lora_base import LoraBaseMixin

    if not isinstance(pipe, LoraBaseMixin):
        raise OSError(f"--lora: {type(pipe).__name__} takes no LoRA adapters in diffusers")
    for name, path in loras:
        weights = lora_file(name, path)
        try:
            pipe.load_lora_weights(str(weights.parent), weight_name=weights.name,
                                   adapter_name=name, local_files_only=True)
        except Exception as exc:  # a truncated file, another format, the peft backend missing
            raise OSError(f"--lora {name}={path}: {weights} could not be loaded as a LoRA: "
                          f"{type(exc).__name__}: {exc}"[:800]) from exc
        if name not in _adapters(pipe):
            raise OSError(f"--lora {name}={path}: {weights} matches no layer of "
                          f"{type(pipe).__name__} (a LoRA for another model family?)")
        log.info("LoRA %s loaded from %s", name, weights)
    pipe.disable_lora()  # until a request names one
    return tuple(name for name, _ in loras)


def _adapters(pipe: Any) -> set[str]:
    return {name for names in pipe.get_list_adapters().values() for name in names}


def require_adapter(loras: Sequence[str], name: str | None) -> None:
    """``InvalidRequest`` on ``adapter`` when ``name`` is not one of this worker's LoRAs."""
    if name is None or name in loras:
        return
    have = ", ".join(repr(n) for n in loras) if loras else \
        "none (a worker loads them at start: --lora NAME=PATH)"
    raise InvalidRequest(f"adapter: no LoRA adapter named {name!r} on this model; its "
                         f"adapters: {have}", param="adapter")


@contextmanager
def applied(pipe: Any, name: str | None, scale: float) -> Iterator[None]:
    """Within the block, the adapter ``name`` alone is on, at ``scale`` (0 gives the base
    model's images); after it every LoRA layer is off again. ``name=None``: nothing changes."""
    if name is None:
        yield
        return
    pipe.enable_lora()
    try:
        pipe.set_adapters([name], adapter_weights=[scale])
        yield
    finally:
        pipe.disable_lora()
