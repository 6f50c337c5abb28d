"""The worker's typed errors. Each carries its HTTP status and OpenAI error code; the HTTP app
turns them into ``{"error": {"message", "type", "param", "code"}}`` bodies."""

from __future__ import annotations

from typing import Any


class WorkerError(Exception):
    """An answer other than success; each subclass names its status and code:
    ``class Busy(WorkerError, status=409, code="busy")``."""

    status = 500
    code = "server_error"

    def __init_subclass__(cls, *, status: int, code: str, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.status, cls.code = status, code

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    def body(self) -> dict[str, Any]:
        """The OpenAI error envelope for this error."""
        return envelope(self.status, str(self), code=self.code, param=self.param)


def envelope(status: int, message: str, *, code: str, param: str | None = None) -> dict[str, Any]:
    """``{"error": {...}}``; the type follows the status (client or server side)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class Unauthorized(WorkerError, status=401, code="invalid_api_key"):
    """The request does not carry the worker's secret (``Authorization: Bearer``)."""


class InvalidRequest(WorkerError, status=400, code="invalid_request"):
    """The request body does not validate."""


class NotReady(WorkerError, status=503, code="not_ready"):
    """The pipeline is still loading, or its load failed."""


class PipelineOffloaded(WorkerError, status=409, code="pipeline_offloaded"):
    """The weights are parked in CPU RAM (or moving): ``POST /onload`` first."""


class Busy(WorkerError, status=409, code="busy"):
    """A generation is admitted or a move is under way, so the weights cannot move now."""


class OffloadUnsupported(WorkerError, status=409, code="offload_unsupported"):
    """A device-mapped pipeline cannot be moved as a whole."""


class Cancelled(WorkerError, status=409, code="cancelled"):
    """The generation was cancelled (``POST /cancel``) before it finished."""


class DuplicateRequestId(WorkerError, status=409, code="duplicate_request_id"):
    """A generation with this request id is already admitted."""


class CudaOutOfMemory(WorkerError, status=503, code="cuda_out_of_memory"):
    """CUDA ran out of memory; the caller may retry later or smaller."""


class GenerationFailed(WorkerError, status=500, code="generation_failed"):
    """The pipeline raised something unexpected while generating."""


class MoveFailed(WorkerError, status=500, code="move_failed"):
    """Moving the weights between VRAM and RAM failed."""


class IllegalTransition(WorkerError, status=500, code="illegal_transition"):
    """A pipeline state change the transition table does not allow (a bug, not a request)."""


class UnsupportedEndpoint(InvalidRequest, status=400, code="unsupported_endpoint"):
    """The route does not serve this pipeline's kind: images on ``/generate``, videos on
    ``/video``."""
