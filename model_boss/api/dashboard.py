"""The operators' page at ``/ui``: static files shipped inside the package, no build step.

The files hold no state and no secret, so they are served without a key (the page asks for
one when the API it calls answers 401). The page itself comes with the first snapshot of the
state (what ``/api/v1/status``, ``/api/v1/queue`` and ``/api/v1/config`` answer) embedded, so
every panel is drawn before the first paint; but only for a caller whose key those reads
would take. A caller without one gets the bare page, which tells it nothing."""

from __future__ import annotations

import logging
from importlib import resources
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import RedirectResponse, Response

from ..errors import NotFound
from . import admin
from .context import coordinator_of
from .middleware.keys import check_key, given_key

log = logging.getLogger(__name__)

router = APIRouter(tags=["dashboard"], include_in_schema=False)

FILES = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "timeline.js": "text/javascript; charset=utf-8",
    "playground.js": "text/javascript; charset=utf-8",
    "talk.js": "text/javascript; charset=utf-8",
    "talk-worklet.js": "text/javascript; charset=utf-8",
    "usage.js": "text/javascript; charset=utf-8",
    "jobs.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
# The page must not be framed or load anything from elsewhere.
HEADERS = {
    "cache-control": "no-cache",
    "x-content-type-options": "nosniff",
    "content-security-policy": "default-src 'self'; img-src 'self' data:; "
                               "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
}
SNAPSHOT_MARK = b"<!-- first snapshot -->"
QUEUE_ROWS = 100  # the rows the page asks GET /api/v1/queue for
# Inside a <script> element only "</script" and "<!--" matter; escaping every <, > and &
# keeps any string in the state (a lease's note) from ending the element.
_HTML_SAFE = ((b"<", b"\\u003c"), (b">", b"\\u003e"), (b"&", b"\\u0026"))


def _read(name: str) -> bytes:
    return resources.files("model_boss").joinpath("ui", name).read_bytes()


@router.get("/ui")
async def dashboard_root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


@router.get("/ui/")
async def dashboard_page(request: Request) -> Response:
    page = _read("index.html")
    snapshot = await _snapshot(request) if _may_read_state(request) else None
    if snapshot is not None:
        try:
            page = page.replace(SNAPSHOT_MARK, snapshot_element(snapshot))
        except TypeError:  # a value JSON cannot say: the bare page, which reads it itself
            log.warning("the dashboard's first snapshot could not be encoded", exc_info=True)
    # the page may carry state now: kept by no cache, shared or not
    return Response(page, media_type=FILES["index.html"],
                    headers={**HEADERS, "cache-control": "no-store"})


@router.get("/ui/{name}")
async def dashboard_file(name: str) -> Response:
    if name not in FILES:
        raise NotFound(f"no dashboard file '{name}'")
    return Response(_read(name), media_type=FILES[name], headers=HEADERS)


def _may_read_state(request: Request) -> bool:
    """Whether this caller's key opens ``/api/v1/status``: the check the API itself makes."""
    keys = coordinator_of(request).keys
    return check_key(given_key(request.headers), keys, admin=True).allowed


async def _snapshot(request: Request) -> dict[str, Any] | None:
    """The three reads the page starts from, as the API answers them; None when one fails
    (the page then reads them itself)."""
    try:
        return {"status": await admin.status(request),
                "queue": await admin.queue(request, limit=QUEUE_ROWS, offset=0),
                "config": await admin.get_config(request)}
    except Exception:
        log.warning("the dashboard's first snapshot failed; the page will read it itself",
                    exc_info=True)
        return None


def snapshot_element(snapshot: dict[str, Any]) -> bytes:
    """``snapshot`` as JSON in an inert ``<script type="application/json">`` element."""
    # the status has integer keys (the queue's count by priority): strings, as the API says
    data = orjson.dumps(jsonable_encoder(snapshot), option=orjson.OPT_NON_STR_KEYS)
    for raw, escaped in _HTML_SAFE:
        data = data.replace(raw, escaped)
    return b'<script type="application/json" id="snapshot">' + data + b"</script>"
