"""What a GGUF file says about its VRAM needs: its header (read with the ``gguf`` package's
type tables), and llama.cpp's own projection of a load (:func:`llama_fit`)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from ..catalog.gguf_header import HeaderReader, gguf_tables

log = logging.getLogger(__name__)

UBATCH = 512          # llama.cpp's default micro-batch: the compute buffer scales with it
FIXED_COMPUTE_MB = 64  # scratch llama.cpp allocates whatever the model


@dataclass(frozen=True, slots=True)
class GGUFInfo:
    architecture: str
    block_count: int
    embedding_length: int
    feed_forward_length: int
    head_count: int
    head_count_kv: int
    head_dim: int
    vocab_size: int
    context_length: int
    total_bytes: int
    block_bytes: tuple[int, ...]
    parameter_count: int = 0
    file_type: int | None = None  # general.file_type: llama.cpp's LlamaFileType

    @property
    def other_bytes(self) -> int:
        """Weights outside the repeating blocks: embeddings, output head, norms."""
        return self.total_bytes - sum(self.block_bytes)

    def kv_bytes(self, ctx: int, layers: int | None = None, k_bytes: float = 2.0,
                 v_bytes: float = 2.0) -> int:
        """K and V for ``ctx`` tokens over ``layers`` blocks (all by default), at ``k_bytes``
        / ``v_bytes`` per element (f16: 2). llama.cpp's server holds ``ctx`` tokens in all,
        however many parallel slots share them."""
        n = self.block_count if layers is None else layers
        return int(n * ctx * self.head_count_kv * self.head_dim * (k_bytes + v_bytes))

    def compute_bytes(self) -> int:
        """Activations and logits for one micro-batch, plus fixed scratch."""
        per_token = (self.vocab_size + 4 * self.embedding_length + self.feed_forward_length) * 4
        return UBATCH * per_token + FIXED_COMPUTE_MB * 2**20


@lru_cache(maxsize=64)
def _read(path: str, _mtime: float) -> GGUFInfo:
    tables = gguf_tables()
    with open(path, "rb", buffering=64 * 1024) as handle:
        header = HeaderReader(handle)
        tensors, kvs = header.begin()
        meta = header.metadata(kvs)
        arch = meta.get("general.architecture", "llama")
        blocks = int(meta.get(f"{arch}.block_count", 0))
        per_block = [0] * blocks
        total = params = 0
        for _ in range(tensors):
            name = header.string()
            dims = [header.unpack("<Q") for _ in range(header.unpack("<I"))]
            block, type_size = tables.GGML_QUANT_SIZES[
                tables.GGMLQuantizationType(header.unpack("<I"))]
            header.unpack("<Q")  # offset
            count = 1
            for dim in dims:
                count *= dim
            size = count * type_size // block
            total += size
            params += count
            parts = name.split(".")
            if parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) < blocks:
                per_block[int(parts[1])] += size
    emb = int(meta.get(f"{arch}.embedding_length", 0))
    heads = int(meta.get(f"{arch}.attention.head_count", 1) or 1)
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads) or heads)
    return GGUFInfo(
        architecture=arch, block_count=blocks, embedding_length=emb,
        feed_forward_length=int(meta.get(f"{arch}.feed_forward_length", 0) or 0),
        head_count=heads, head_count_kv=kv_heads,
        head_dim=int(meta.get(f"{arch}.attention.key_length", 0) or (emb // heads)),
        vocab_size=int(meta.get("tokenizer.ggml.tokens", 32000)),
        context_length=int(meta.get(f"{arch}.context_length", 0) or 0),
        total_bytes=total, block_bytes=tuple(per_block), parameter_count=params,
        file_type=meta.get("general.file_type"))


def read_gguf_info(path: Path) -> GGUFInfo | None:
    """Parsed metadata (cached per path and mtime), or None when the file is not GGUF."""
    try:
        return _read(str(path), path.stat().st_mtime)
    except Exception as exc:  # a truncated or foreign file: fall through to the next rung
        log.debug("cannot read GGUF metadata from %s: %s", path, exc)
        return None


def layer_costs_mb(info: GGUFInfo, ctx: int, k_bytes: float = 2.0,
                   v_bytes: float = 2.0) -> tuple[float, float]:
    """(MB per offloaded layer: weights + its KV, MB that stay on the GPU regardless)."""
    per_layer = (sum(info.block_bytes) / max(1, info.block_count)
                 + info.kv_bytes(ctx, 1, k_bytes, v_bytes)) / 2**20
    fixed = (info.other_bytes + info.compute_bytes()) / 2**20
    return per_layer, fixed


# -- llama.cpp's projection ---------------------------------------------------------------

FIT_TIMEOUT_S = 60.0
FIT_CACHE = Path("~/.cache/model-boss/llama-fit.json")
_REPO_ROOT = Path(__file__).resolve().parents[2]  # where the ``workers`` package lives
# a row of llama.cpp's memory breakdown: "| - CUDA0 (...) | ... self = model + context + compute"
_FIT_ROW = re.compile(r"\|\s+-\s+(?P<device>[^|]+?)\s+\|[^|]*?(?P<self>\d+)\s*=\s*"
                      r"(?P<model>\d+)\s*\+\s*(?P<context>\d+)\s*\+\s*(?P<compute>\d+)")
_fit_memo: dict[str, FitProjection | None] = {}


@dataclass(frozen=True, slots=True)
class FitProjection:
    """MiB llama.cpp projects for a load, summed over the devices it would use."""

    devices: tuple[str, ...]
    model_mb: int
    context_mb: int
    compute_mb: int

    @property
    def host_only(self) -> bool:
        """Projected by a CPU build: every buffer in host memory."""
        return all(d.split()[0] in ("Host", "CPU") for d in self.devices)


def parse_fit_output(text: str) -> FitProjection | None:
    """The first memory breakdown table in llama.cpp's log (the initial parameters)."""
    rows: list[re.Match[str]] = []
    for line in text.splitlines():
        if "projected to use" in line and rows:
            break
        if "memory_breakdown_print" in line:
            row = _FIT_ROW.search(line)
            if row:
                rows.append(row)
    if not rows:
        return None
    return FitProjection(tuple(r["device"].strip() for r in rows),
                         sum(int(r["model"]) for r in rows),
                         sum(int(r["context"]) for r in rows),
                         sum(int(r["compute"]) for r in rows))


def run_fit_probe(argv_tail: list[str]) -> str:
    """``python -m workers.llama --fit-only ...``'s output ("" when it cannot run)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH"))
                                        if p)
    try:
        done = subprocess.run([sys.executable, "-m", "workers.llama", "--fit-only",
                               *argv_tail], capture_output=True, text=True, env=env,
                              timeout=FIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("llama.cpp fit probe failed: %s", exc)
        return ""
    return done.stdout + done.stderr


def llama_fit(path: Path, *, ctx_size: int, parallel: int, cache_type_k: str,
              cache_type_v: str, flash_attn: str, runner=run_fit_probe,
              cache_file: Path | None = FIT_CACHE) -> FitProjection | None:
    """llama.cpp's projection for loading ``path`` with these settings, or None without the
    ``xllamacpp`` package or when it cannot tell. A probe takes about half a second (a
    process that fits, allocating nothing); answers are kept per file, settings and
    llama.cpp version, in memory and in ``cache_file``."""
    if importlib.util.find_spec("xllamacpp") is None:
        return None
    try:
        stat = path.stat()
        version = importlib.metadata.version("xllamacpp")
    except (OSError, importlib.metadata.PackageNotFoundError):
        return None
    key = (f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{ctx_size}|{parallel}|"
           f"{cache_type_k}|{cache_type_v}|{flash_attn}|xllamacpp {version}")
    if key in _fit_memo:
        return _fit_memo[key]
    stored = _read_fit_cache(cache_file).get(key)
    if stored is not None:
        found: FitProjection | None = FitProjection(tuple(stored["devices"]),
                                                    stored["model_mb"], stored["context_mb"],
                                                    stored["compute_mb"])
    else:
        found = parse_fit_output(runner([
            "--model", str(path), "--port", "0", "--ctx-size", str(ctx_size),
            "--parallel", str(parallel), "--cache-type-k", cache_type_k,
            "--cache-type-v", cache_type_v, "--flash-attn", flash_attn]))
        if found is not None:
            _write_fit_cache(cache_file, key, found)
    _fit_memo[key] = found
    return found


def _read_fit_cache(cache_file: Path | None) -> dict:
    if cache_file is None:
        return {}
    try:
        data = json.loads(cache_file.expanduser().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_fit_cache(cache_file: Path | None, key: str, found: FitProjection) -> None:
    if cache_file is None:
        return
    data = _read_fit_cache(cache_file)
    data[key] = asdict(found)
    target = cache_file.expanduser()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(data, indent=1))
        temporary.replace(target)
    except OSError as exc:
        log.debug("cannot keep llama.cpp fit figures in %s: %s", target, exc)
