"""The errors model-boss raises, each carrying its HTTP status and OpenAI envelope fields.

Lower layers (httpx, redis, subprocess) are converted into these at the boundary with
``raise X from exc`` so the rest of the code and every client see one hierarchy.
"""

from __future__ import annotations

import json
from typing import Any

# the Retry-After of a 503 whose cause gave none: a later try may find the model loaded,
# room freed or a file back in place
RETRY_503_S = 5.0


class ModelBossError(Exception):
    """Base error: rendered as ``{"error": {"message", "type", "param", "code"}}``."""

    status_code = 500
    error_type = "server_error"
    code: str | None = "internal_error"
    # the Retry-After of an error raised without one: every 503 carries one (a class may say
    # its own; else RETRY_503_S)
    retry_after_default_s: float | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
        status_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if status_code is not None:
            self.status_code = status_code
        self.retry_after_s = retry_after_s
        # more fields of the error object, as a worker gave them (llama.cpp's n_ctx, ...)
        self.details: dict[str, Any] = {}

    def envelope(self) -> dict[str, Any]:
        return {
            "error": {
                **self.details,
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        retry = self.retry_after_s if self.retry_after_s is not None \
            else self.retry_after_default_s
        if retry is None and self.status_code == 503:
            retry = RETRY_503_S
        if retry is None:
            return {}
        return {"Retry-After": str(max(1, round(retry)))}


class ConfigError(ModelBossError):
    """A settings file, manifest or tasks file is wrong; the message names file and field."""

    status_code = 400
    error_type = "invalid_request_error"
    code = "invalid_config"


class BadRequest(ModelBossError):
    status_code = 400
    error_type = "invalid_request_error"
    code = "invalid_request"


class Forbidden(ModelBossError):
    status_code = 403
    error_type = "permission_error"
    code = "model_not_allowed"


class Unauthorized(ModelBossError):
    status_code = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class ModelNotFound(ModelBossError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class NotFound(ModelBossError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "not_found"


class JobNotFound(NotFound):
    """A job id the caller cannot have: never given, expired, or another key's. One answer
    for all three, so that the difference tells no key which job ids exist."""

    code = "job_not_found"

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job '{job_id}' does not exist (or its result has expired)",
                         param="job_id")


class PayloadTooLarge(ModelBossError):
    status_code = 413
    error_type = "invalid_request_error"
    code = "payload_too_large"


class ModelUnavailable(ModelBossError):
    """The model is known but cannot be served (missing file, disabled)."""

    status_code = 503
    error_type = "server_error"
    code = "model_unavailable"
    retry_after_default_s = 30.0  # a file put back or a manifest enabled takes a while


class LoadFailed(ModelBossError):
    """The worker could not be started or never became healthy."""

    status_code = 503
    error_type = "server_error"
    code = "model_load_failed"
    retry_after_default_s = 10.0


class WorkerCrashed(ModelBossError):
    """The worker died or broke the connection while serving a request."""

    status_code = 502
    error_type = "server_error"
    code = "worker_failed"


class UpstreamError(ModelBossError):
    """The worker (or a cloud remote) answered with an error status."""

    status_code = 502
    error_type = "server_error"
    code = "upstream_error"


class CapacityExceeded(ModelBossError):
    """No room now and none expected within the request's wait limit."""

    status_code = 503
    error_type = "server_error"
    code = "capacity_exceeded"


class ModelBusy(CapacityExceeded):
    """An unload or offload found the model serving requests and was not asked to wait."""

    status_code = 409
    code = "model_busy"

    def __init__(self, model_id: str, active: int) -> None:
        super().__init__(f"'{model_id}' is serving {active} request(s)", retry_after_s=2)


class BudgetExceeded(ModelBossError):
    """The request's own time budget cannot be met: a refusal of what was asked, not a fault
    of the server (503 with Retry-After: a later try may fit)."""

    status_code = 503
    error_type = "invalid_request_error"
    code = "budget_exceeded"


class RateLimited(ModelBossError):
    status_code = 429
    error_type = "rate_limit_error"
    code = "rate_limited"


class QuotaExceeded(RateLimited):
    """A key has spent a day's or a month's quota; ``Retry-After`` is when it resets."""

    code = "quota_exceeded"


class Conflict(ModelBossError):
    status_code = 409
    error_type = "invalid_request_error"
    code = "conflict"


class LeaseUnavailable(ModelBossError):
    """GPUBoss could not grant a lease: not enough free VRAM on the GPUs asked for."""

    status_code = 503
    error_type = "server_error"
    code = "lease_unavailable"


class LeaseNotFound(ModelBossError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "lease_not_found"


class StoreUnavailable(ModelBossError):
    """The lease store (Redis) cannot be reached."""

    status_code = 503
    error_type = "server_error"
    code = "store_unavailable"


def error_text(body: bytes | str, status: int | None = None) -> str:
    """An error answer's message on one line, whatever its envelope: OpenAI's and
    Anthropic's ``{"error": {"message"}}``, Ollama's ``{"error": "..."}``, FastAPI's
    ``{"detail"}``; else the body's own text, else ``HTTP <status>``. What the command line
    prints of a daemon's refusal."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    message: Any = None
    if isinstance(data, dict):
        error = data.get("error", data.get("detail"))
        message = error.get("message") if isinstance(error, dict) else error
        if isinstance(message, list):  # FastAPI's validation errors
            message = "; ".join(str(m.get("msg", m)) if isinstance(m, dict) else str(m)
                                for m in message)
    line = " ".join(str(message if message else text).split())
    return line or (f"HTTP {status}" if status else "request failed")


# the causes a connection fails for, as a person can act on them (first match wins)
_NETWORK_REASONS: tuple[tuple[str, str], ...] = (
    ("gaierror", "name resolution failed (no DNS, or no such host)"),
    ("ConnectionRefusedError", "connection refused (nothing listens there)"),
    ("SSLCertVerificationError", "TLS certificate not trusted"),
    ("SSLError", "TLS handshake failed"),
    ("ProxyError", "the proxy refused"),
    ("ConnectTimeout", "timed out connecting"),
    ("ReadTimeout", "timed out waiting for the answer"),
    ("TimeoutException", "timed out"),
    ("TimeoutError", "timed out"),
    ("UnsupportedProtocol", "not an http:// or https:// URL"),
    ("InvalidURL", "not a valid URL"),
    ("RemoteProtocolError", "the connection closed mid-answer"),
    ("ConnectionResetError", "the connection was reset"),
    ("NetworkUnreachable", "the network is unreachable"),
)


def network_reason(exc: BaseException) -> str:
    """Why a connection failed, in words (name resolution, refused, TLS, timeout, ...), from
    ``exc`` and the exceptions it was raised from; else its message (else its type)."""
    seen: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and cause not in seen and len(seen) < 8:
        seen.append(cause)
        cause = cause.__cause__ or cause.__context__
    names = [klass.__name__ for error in seen for klass in type(error).__mro__]
    if any(getattr(e, "errno", None) == 101 for e in seen):  # ENETUNREACH
        names.append("NetworkUnreachable")
    for name, reason in _NETWORK_REASONS:
        if name in names:
            detail = next((str(e) for e in reversed(seen) if str(e)), "")
            return f"{reason}: {detail}" if detail and name.startswith("SSL") else reason
    return str(exc) or type(exc).__name__
