"""The transformers worker: embedders (sentence-transformers), rerankers (CrossEncoder) on
one model each, batching concurrent requests; ``python -m workers.transformers``."""
