"""``--fit-only``: llama.cpp's own projection of the memory a load would take, without loading.

llama.cpp's parameter fitting measures the model, context and compute buffers with nothing
allocated and prints a table per device (``common_memory_breakdown_print``); the coordinator
reads that table from this process's output (``model_boss.gpu.estimate``). The no-alloc load
cannot go on to serve, so the process ends right after the table, with whatever status.
"""

from __future__ import annotations

import os
import resource
import sys

from .options import WorkerOptions, to_params


def project(options: WorkerOptions) -> None:
    """Print llama.cpp's memory breakdown for ``options`` and exit."""
    os.environ["GGML_NO_BACKTRACE"] = "1"  # the no-alloc load aborts: no debugger, no core
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    import xllamacpp

    params = to_params(options)
    params.fit_params = True  # the fitting step is what measures; it runs for "auto" layers
    params.n_gpu_layers = -1
    params.fit_params_print = True
    params.no_alloc = True
    params.warmup = False
    params.verbosity = 4  # the fitting step runs (and prints its table) at this level
    try:
        xllamacpp.Server(params)
    except BaseException as exc:  # the table, if any, is already printed
        print(f"fit: {exc}", file=sys.stderr, flush=True)
    sys.stderr.flush()
    os._exit(0)
