"""The worker's error answer, in OpenAI's envelope."""

from __future__ import annotations

from fastapi.responses import JSONResponse


class WorkerError(Exception):
    def __init__(self, status: int, message: str, code: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def response(self) -> JSONResponse:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return JSONResponse({"error": {"message": self.message, "type": kind,
                                       "param": self.param, "code": self.code}},
                            status_code=self.status)
