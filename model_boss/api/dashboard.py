"""The operators' page at ``/ui``: static files shipped inside the package, no build step.

The files hold no state and no secret, so they are served without a key (the page asks for
one when the API it calls answers 401). Only the files named here are served."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from ..errors import NotFound

router = APIRouter(tags=["dashboard"], include_in_schema=False)

FILES = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
# The page must not be framed or load anything from elsewhere.
HEADERS = {
    "cache-control": "no-cache",
    "x-content-type-options": "nosniff",
    "content-security-policy": "default-src 'self'; img-src 'self' data:; "
                               "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
}


def _read(name: str) -> bytes:
    return resources.files("model_boss").joinpath("ui", name).read_bytes()


@router.get("/ui")
async def dashboard_root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


@router.get("/ui/")
async def dashboard_page() -> Response:
    return Response(_read("index.html"), media_type=FILES["index.html"], headers=HEADERS)


@router.get("/ui/{name}")
async def dashboard_file(name: str) -> Response:
    if name not in FILES:
        raise NotFound(f"no dashboard file '{name}'")
    return Response(_read(name), media_type=FILES[name], headers=HEADERS)
