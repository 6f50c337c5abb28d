"""InternalErrors: the last-resort answer to an unexpected exception."""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import internal_error

log = logging.getLogger(__name__)


class InternalErrors:
    """Answers an unexpected exception with a 500 envelope and does not re-raise it, so the
    server keeps the keep-alive connection (uvicorn closes it when an app raises)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            if started:  # half a response cannot be mended; the server ends the connection
                raise
            log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            await internal_error(exc)(scope, receive, send)
