"""Which files of a transformers repository a pull fetches: ``hf://ORG/REPO`` for a repository
with no GGUF file and a ``config.json`` (an embedder, a reranker, Whisper, an MMS voice) is
fetched as the folder the transformers worker loads, without the copies of its weights made
for other runtimes (ONNX, OpenVINO, TensorFlow, Flax, Core ML) and, when it has safetensors,
without its pickled PyTorch weights."""

from __future__ import annotations

from pathlib import PurePosixPath

OTHER_RUNTIMES = ("onnx/", "openvino/", "coreml/", "tf/", "flax/", "mlx/")
OTHER_SUFFIXES = (".h5", ".msgpack", ".ot", ".onnx", ".onnx_data", ".tflite", ".mlmodel",
                  ".pb", ".gguf", ".ckpt", ".npz")
OTHER_PREFIXES = ("tf_model", "flax_model", "rust_model", "model.onnx", "openvino_model")


def is_folder_repo(files: list[str]) -> bool:
    """A repository to pull whole (no GGUF file, a ``config.json`` at its top)."""
    return "config.json" in files and not any(f.lower().endswith(".gguf") for f in files)


def choose_folder_files(files: list[str]) -> list[str]:
    """The repository's files the worker needs, in the repository's order."""
    def wanted(name: str) -> bool:
        leaf = PurePosixPath(name).name
        return not (name.startswith(OTHER_RUNTIMES) or leaf.lower().endswith(OTHER_SUFFIXES)
                    or leaf.startswith(OTHER_PREFIXES) or leaf.startswith("."))

    kept = [f for f in files if wanted(f)]
    if any(PurePosixPath(f).name.endswith(".safetensors") for f in kept):
        kept = [f for f in kept
                if not PurePosixPath(f).name.startswith("pytorch_model")]  # .bin and its index
    return kept
