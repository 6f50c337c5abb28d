"""Small real LoRA adapters for a GGUF model, as llama.cpp's ``convert_lora_to_gguf.py`` writes
them (``gguf``'s own writer), and broken ones for the paths where a load must fail.

llama.cpp's loader (``src/llama-adapter.cpp``) wants ``general.type = "adapter"``,
``adapter.type = "lora"``, ``general.architecture`` equal to the model's, and for each adapted
weight ``W`` (ggml shape ``[n_in, n_out]``) a pair ``W.lora_a`` of ggml shape ``[n_in, rank]``
and ``W.lora_b`` of ``[rank, n_out]`` (numpy: ``(rank, n_in)`` and ``(n_out, rank)``); it adds
``scale * alpha / rank * B @ A`` to ``W``. Here ``alpha = rank``, so a request's scale is the
update's own size.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

FLAWS = ("architecture", "shape")


def _base(base_gguf: Path) -> tuple[str, dict[str, str], dict[str, object]]:
    """The base model's architecture, its naming keys, and its tensors by name (kept while
    the file is unchanged: reading a converted model's header, its vocabulary among it, takes
    ``gguf`` seconds)."""
    return _read_base(str(base_gguf), Path(base_gguf).stat().st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _read_base(base_gguf: str, mtime_ns: int) -> tuple[str, dict[str, str], dict[str, object]]:
    import gguf

    reader = gguf.GGUFReader(base_gguf)

    def text(key: str) -> str | None:
        field = reader.get_field(key)
        return None if field is None else str(field.contents())

    arch = text(gguf.Keys.General.ARCHITECTURE)
    if not arch:
        raise ValueError(f"{base_gguf}: no general.architecture")
    naming = {key: value for key, value in (
        ("name", text(gguf.Keys.General.NAME)),
        ("organization", text(gguf.Keys.General.ORGANIZATION)),
        ("repo_url", text(gguf.Keys.General.REPO_URL))) if value}
    return arch, naming, {tensor.name: tensor for tensor in reader.tensors}


def _pairs(tensors: dict[str, object], rank: int, scale: float, seed: int,
           targets: tuple[str, ...]) -> dict[str, object]:
    """``lora_a`` / ``lora_b`` for every block's ``targets``: random, with ``B @ A``'s entries
    spread ``scale`` times as wide as the base weight's own (so 0.5 moves a greedy answer of a
    small model, and 1.0 in another seed moves it elsewhere)."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    pairs: dict[str, object] = {}
    names = sorted((n for n in tensors if n.startswith("blk.") and n.endswith(".weight")
                    and n.split(".")[2] in targets), key=lambda n: (int(n.split(".")[1]), n))
    if not names:
        raise ValueError(f"the base has no blk.N.{{{','.join(targets)}}}.weight tensors")
    for name in names:
        tensor = tensors[name]
        weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type)  # (n_out, n_in)
        n_out, n_in = weight.shape
        spread = scale * float(weight.std()) / np.sqrt(rank)
        pairs[f"{name}.lora_a"] = rng.standard_normal((rank, n_in)).astype(np.float32)
        pairs[f"{name}.lora_b"] = (rng.standard_normal((n_out, rank)) * spread).astype(
            np.float32)
    return pairs


def _write(path: Path, arch: str, naming: dict[str, str], alpha: float,
           pairs: dict[str, object], label: str) -> Path:
    """The adapter file, written whole or not at all."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + f".{os.getpid()}.partial")
    writer = gguf.GGUFWriter(str(partial), arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    writer.add_name(label)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if naming:  # what convert_lora_to_gguf.py writes from the model card's base_model
        writer.add_base_model_count(1)
        if "name" in naming:
            writer.add_base_model_name(0, naming["name"])
        if "organization" in naming:
            writer.add_base_model_organization(0, naming["organization"])
        if "repo_url" in naming:
            writer.add_base_model_repo_url(0, naming["repo_url"])
    for name, data in pairs.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(path)
    return path


def write_lora_gguf(path: Path, base_gguf: Path, rank: int = 4, scale: float = 0.5,
                    seed: int = 0, targets: tuple[str, ...] = ("attn_q", "attn_v")) -> Path:
    """A LoRA adapter for ``base_gguf`` (any architecture its header names): rank ``rank``
    pairs on every block's ``targets`` weights, F32, ``alpha = rank``; the update ``B @ A``
    has entries ``scale`` times the base weight's spread. The same arguments write the same
    file."""
    arch, naming, tensors = _base(base_gguf)
    pairs = _pairs(tensors, rank, scale, seed, targets)
    return _write(path, arch, naming, float(rank), pairs, f"lora-r{rank}-s{seed}")


def write_broken_lora_gguf(path: Path, base_gguf: Path, flaw: str = "architecture",
                           rank: int = 4) -> Path:
    """An adapter llama.cpp refuses for ``base_gguf``: ``architecture``, a right one written
    for another architecture ("model arch and LoRA arch mismatch"); ``shape``, one whose
    ``lora_a`` is a column short ("has incorrect shape")."""
    if flaw not in FLAWS:
        raise ValueError(f"flaw is one of {FLAWS}, not {flaw!r}")
    import numpy as np

    arch, naming, tensors = _base(base_gguf)
    pairs = _pairs(tensors, rank, 0.5, 0, ("attn_q",))
    if flaw == "architecture":
        arch = "qwen2" if arch != "qwen2" else "llama"
    else:
        first = next(iter(pairs))
        pairs[first] = np.ascontiguousarray(pairs[first][:, :-1])
    return _write(path, arch, naming, float(rank), pairs, f"broken-{flaw}")


def shared_lora(tmp_path_factory, name: str, seed: int, scale: float = 0.5,
                base_gguf: Path | None = None) -> Path:
    """``write_lora_gguf(..., seed=seed, scale=scale)`` for ``base_gguf`` (the demo model when
    None), built once per run however many test processes ask: the first writes it under a
    lock in the directory xdist's processes share, the rest read it."""
    from filelock import FileLock

    from tests.conftest import DEMO_GGUF

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / "shared-lora" / f"{name}.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f"shared-lora-{name}.lock")):
        if not path.exists():
            write_lora_gguf(path, base_gguf or DEMO_GGUF, scale=scale, seed=seed)
    return path
