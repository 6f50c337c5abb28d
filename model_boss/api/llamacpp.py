"""llama.cpp's own routes (``/completion`` and ``/completions``, ``/infill``, ``/tokenize``,
``/detokenize``, ``/apply-template``, ``/props``, ``/slots``), for clients written for
``llama-server``: each reaches the worker of the model the body (or ``?model=``) names, else
the default task's, through the queue, leases and keys like every other request (``/slots``
reads the running worker, unqueued)."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from ..services import pop_extensions, serve
from ..services.native import NATIVE_BODIES, PROPS
from ..services.schemas import OpenAIRequest
from ..services.worker_slots import SLOTS, worker_slots
from ..tenancy.keys import identity_of
from .context import coordinator_of, disconnect_watch, to_response
from .errors import OpenAIError, documented
from .openai import serve_body

router = APIRouter(tags=["llama.cpp"], responses=documented(OpenAIError))


def _native_route(endpoint: str, body_type: type[OpenAIRequest]) -> None:
    async def handle(request: Request, body: OpenAIRequest) -> Response:
        return await serve_body(request, endpoint, body)

    # the body's model is the route's own (FastAPI reads it from the annotations)
    handle.__annotations__ = {"request": Request, "body": body_type, "return": Response}
    router.add_api_route(endpoint, handle, methods=["POST"],
                         name=endpoint.strip("/").replace("-", "_"),
                         summary=(body_type.__doc__ or "").split("\n")[0])


for _endpoint, _body in NATIVE_BODIES.items():
    _native_route(_endpoint, _body)


@router.get("/props")
async def props(request: Request,
                model: str | None = Query(default=None, min_length=1,
                                          description="a model id or alias; else the default "
                                                      "task's")) -> Response:
    """The worker's properties (context size, chat template, generation defaults), its
    file by name only."""
    data = {"model": model} if model else {}
    ext = pop_extensions(data, request.headers,
                         identity_of(request.scope))
    async with disconnect_watch(request) as gone:
        served = await serve(coordinator_of(request), PROPS, data, ext, disconnected=gone)
    return to_response(served)


@router.get(SLOTS)
async def slots(request: Request,
                model: str | None = Query(default=None, min_length=1,
                                          description="a model id or alias; else the default "
                                                      "task's")) -> Response:
    """The running worker's slots, as llama-server lists them (``is_processing`` each), read
    live and never queued; 409 when the model is not loaded."""
    return to_response(await worker_slots(coordinator_of(request), model))
