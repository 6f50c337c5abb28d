"""Backends: how a model runs. The backend protocol and the HTTP-worker base, the worker
process supervisor, the upstream client, the spare workers, and one module per backend kind
(the registry, :data:`~.registry.BACKENDS`, maps a manifest's ``backend`` to its kind).

Nothing here imports the slots or the scheduling rules: a backend starts, serves and stops
one worker and reports what it sees; its slot's owner decides when."""

from .base import HttpWorkerBackend, InferenceBackend, UpstreamResponse

__all__ = ["HttpWorkerBackend", "InferenceBackend", "UpstreamResponse"]
