"""The native llama.cpp worker: llama.cpp's own HTTP server, in-process through ``xllamacpp``.

Run as ``python -m workers.llama --model FILE --port N ...``. The flags are ``llama-server``'s
own long names (``options``), so the coordinator builds one command line for this worker and
for an external ``llama-server`` binary. The server answers ``/health``, ``/props``, ``/slots``,
``/metrics`` and the OpenAI routes once the model is loaded; every route but ``/health`` needs
the API key from ``LLAMA_API_KEY`` (as ``llama-server`` reads it), kept out of argv. The worker
dies with its parent (PR_SET_PDEATHSIG and ``--parent-pid``) and exits 0 on SIGTERM.

Modules: ``options`` (the command line → ``xllamacpp.CommonParams``), ``adapters`` (LoRA
adapters and a draft model: their flags and params), ``lifetime`` (parent watch, stop on a
signal), ``fit`` (``--fit-only``: llama.cpp's own memory projection).
"""

from __future__ import annotations

from .adapters import DraftModel, LoraAdapter
from .options import API_KEY_ENV, WorkerOptions, parse_args, to_params

__all__ = ["API_KEY_ENV", "DraftModel", "LoraAdapter", "WorkerOptions", "parse_args",
           "to_params"]
