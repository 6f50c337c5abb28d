"""Tiny random-weight models for the transformers worker, built here with ``save_pretrained``:
a sentence-transformers embedder (BERT, mean pooling) and a CrossEncoder reranker (BERT with
one label), over a small WordPiece vocabulary written by the test. No hub access."""

from __future__ import annotations

import os
from pathlib import Path

WORDS = ("the a cat dog sat on mat sun rose is was red blue big small paris france capital "
         "of city river what where who why how and or not in to it hello world sentence "
         "one two three four five model boss gpu queue").split()


def _tokenizer(workdir: Path):
    from transformers import BertTokenizerFast

    workdir.mkdir(parents=True, exist_ok=True)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = list("abcdefghijklmnopqrstuvwxyz0123456789.,?!") + \
        [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
    (workdir / "vocab.txt").write_text("\n".join(specials + WORDS + letters) + "\n")
    return BertTokenizerFast(str(workdir / "vocab.txt"), model_max_length=128)


def _config(labels: int | None = None):
    from transformers import BertConfig

    extra = {"num_labels": labels} if labels else {}
    return BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64,
                      max_position_embeddings=128, **extra)


def build_embedder(path: Path, hidden: int = 32, layers: int = 2) -> Path:
    """A sentence-transformers folder (modules.json, a BERT, mean pooling)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import BertModel

    try:  # where sentence-transformers 6 keeps them
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Pooling, Transformer

    torch.manual_seed(0)
    raw = path.parent / (path.name + "-bert")
    config = _config()
    config.hidden_size, config.num_hidden_layers = hidden, layers
    config.intermediate_size = hidden * 4
    config.num_attention_heads = max(1, hidden // 32)
    BertModel(config).save_pretrained(raw)
    _tokenizer(raw).save_pretrained(raw)
    word = Transformer(str(raw), max_seq_length=128)
    dimension = getattr(word, "get_embedding_dimension", None) or \
        word.get_word_embedding_dimension
    pooling = Pooling(dimension(), "mean")
    SentenceTransformer(modules=[word, pooling], device="cpu").save(str(path))
    return path


def build_reranker(path: Path) -> Path:
    """A CrossEncoder folder: BERT for sequence classification with one label."""
    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(1)
    BertForSequenceClassification(_config(labels=1)).save_pretrained(path)
    _tokenizer(path).save_pretrained(path)
    return path


def shared(tmp_path_factory, name: str, build) -> Path:
    """``build(path)`` once per run however many test processes ask (see shared_tiny_sd)."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / f"shared-{name}"
    with FileLock(str(root / f"shared-{name}.lock")):
        if not path.exists():
            partial = root / f"shared-{name}.partial"
            build(partial)
            partial.rename(path)
    return path
