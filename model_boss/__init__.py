"""model-boss: serve many local models on a few GPUs behind one OpenAI-compatible API."""

__version__ = "0.1.0"
