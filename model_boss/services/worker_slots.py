"""``GET /slots``: a llama.cpp worker's slots as its server lists them (``is_processing``,
``n_ctx``, the task each runs), read live from the running worker and never queued: a client
watches a busy model's slots, or sees that the request it cancelled freed its slot."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ModelBossError
from ..slots.slot import SlotState
from .native import worker_get
from .served import MODEL_HEADER, Served
from .serving import default_task

if TYPE_CHECKING:
    from ..coordinator import Coordinator

SLOTS = "/slots"


class NotLoaded(ModelBossError):
    status_code = 409
    error_type = "invalid_request_error"
    code = "model_not_loaded"


async def worker_slots(coord: Coordinator, model: str | None) -> Served:
    """The slots of the model ``model`` names (an id, alias or task; else the default task's),
    from the first of its candidates that runs; 409 when none runs."""
    plan = await coord.router.resolve(model, task=None if model else default_task(coord))
    for model_id in plan.candidates:
        ready = [o.slot for o in coord.pool.replicas(model_id)
                 if o.slot.state is SlotState.READY]  # any copy runs it: the first that does
        backend = ready[0].backend if ready else None
        if backend is not None:
            reply = await worker_get(backend, model_id, SLOTS)
            return Served(200, {MODEL_HEADER: model_id}, "application/json",
                          body=reply.content)
    names = ", ".join(plan.candidates)
    raise NotLoaded(f"'{names}' is not loaded, so it has no slots: send it a request or "
                    f"POST /api/v1/models/{plan.candidates[0]}/load first", param="model")
