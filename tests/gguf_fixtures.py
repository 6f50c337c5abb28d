"""Small real GGUF files for discovery tests and benchmarks: the model's keys, a vocabulary
after them (as converted models have it), one small tensor (``gguf``'s own writer)."""

from __future__ import annotations

from pathlib import Path


def write_gguf(path: Path, arch: str = "llama", context: int = 8192,
               pooling: int | None = None, vocab: int = 50, blocks: int = 1) -> Path:
    import gguf
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(context)
    writer.add_block_count(blocks)
    if pooling is not None:
        writer.add_pooling_type(gguf.PoolingType(pooling))
    writer.add_token_list([f"t{i}" for i in range(vocab)])
    writer.add_chat_template("{{ messages }}")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
