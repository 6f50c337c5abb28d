"""Budget admission: will a request finish within its budget? A pure decision."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ModelBossError, RateLimited
from ..gpu.placement import Placement, fixed_layers, partial_layers
from ..slot_key import slot_key
from .planner import Evict, Fit
from .states import SlotState

if TYPE_CHECKING:
    from ..catalog import ModelManifest
    from ..events import EventBus
    from ..settings import Settings
    from .request import Arrivals, Backlog, QueuedRequest
    from .requestors import RequestorRegistry
    from .seams import SlotBoard


@dataclass(frozen=True, slots=True)
class Prediction:
    wait_s: float
    load_s: float
    infer_s: float

    @property
    def total_s(self) -> float:
        return self.wait_s + self.load_s + self.infer_s


@dataclass(frozen=True, slots=True)
class Decision:
    admitted: bool
    predicted_s: float
    reason: str
    retry_after_s: float | None = None


def predict(*, warm: bool, loading: bool, ahead: int, parallel: int, load_s: float,
            infer_s: float) -> Prediction:
    """Queue wait (requests ahead on the same model, served ``parallel`` at a time) + cold
    load (none when warm, half when a load is already under way) + one inference."""
    wait = (ahead / max(1, parallel)) * infer_s
    load = 0.0 if warm else (load_s / 2 if loading else load_s)
    return Prediction(wait, load, infer_s)


def admit(budget_s: float | None, prediction: Prediction,
          given_s: float | None = None) -> Decision:
    """``budget_s``: what is left of the budget ``given_s`` (the same when None)."""
    if budget_s is None:
        return Decision(True, prediction.total_s, "no budget")
    if prediction.total_s <= budget_s:
        return Decision(True, prediction.total_s,
                        f"predicted {prediction.total_s:.2f}s within {budget_s:g}s")
    return Decision(
        False, prediction.total_s,
        f"predicted {prediction.total_s:.2f}s (wait {prediction.wait_s:.2f}s + load "
        f"{prediction.load_s:.2f}s + inference {prediction.infer_s:.2f}s) exceeds "
        + (f"the budget of {budget_s:g}s" if given_s is None or given_s == budget_s else
           f"the {max(0.0, budget_s):.2f}s left of the budget of {given_s:g}s"),
        retry_after_s=max(1.0, prediction.wait_s + prediction.load_s))


def placed_layers(manifest: ModelManifest, placement: Placement | None,
                  planned: Placement | None) -> int | None:
    """The layers a model runs with on the GPU when only some are there (None: whole), the
    count its learned inference figures are kept by: its copy's ``placement`` when it has
    one (loaded, loading), else the ``planned`` one of a load now, else none (whole)."""
    return partial_layers(placement or planned, manifest.gpu_layers)


def may_run_in_layers(manifest: ModelManifest) -> bool:
    """Whether a load of the model may keep only some of its layers on the GPU (a count of
    its own, or as many as fit), so that its inference time depends on its placement."""
    return manifest.allow_partial or fixed_layers(manifest.gpu_layers) is not None


class Admission:
    """The queue's checks on the way in (:class:`~.queue.InferenceQueue` is one): what a
    request is predicted to take, and the 429s of full queues."""

    pool: SlotBoard
    settings: Settings
    events: EventBus
    requestors: RequestorRegistry
    arrivals: Arrivals
    _pending: Backlog

    async def planned(self, request: QueuedRequest) -> Placement | None:
        """For a budget: the planner's placement of a load of the request's model now, when
        the model is not placed and may run with only some of its layers on the GPU (its
        inference time is the one learned at the layers that load would give it); else
        None. Asked before the request counts as queued, so the checks and the queueing
        after it stay one synchronous step."""
        slot = self.pool.slots.get(slot_key(request.model_id))
        entry = self.pool.catalog.find(request.model_id)
        if (slot is not None and slot.placement is not None) or entry is None \
                or not may_run_in_layers(entry.manifest):
            return None
        with contextlib.suppress(ModelBossError):  # an unknown model fails in dispatch
            plan = await self.pool.plan(slot_key(request.model_id), request.priority)
            return plan.placement if isinstance(plan, Fit | Evict) else None
        return None

    def predict(self, request: QueuedRequest, planned: Placement | None = None) -> Prediction:
        """Expected wait + load + inference for ``request`` if it were queued now; the
        inference of its asked length at the learned rate of its model with the layers it
        runs with (:func:`placed_layers`: its first copy's placement, else ``planned``)."""
        first = slot_key(request.model_id)  # the model's first copy
        slot = self.pool.slots.get(first)
        learned = self.pool.learned
        warm = slot is not None and slot.state == SlotState.READY
        # every waiting request came earlier: those ahead are the ones of its priority or a
        # more important one
        ahead = (slot.active if slot else 0) + self._pending.of_model(request.model_id,
                                                                      request.priority)
        size, layers = 0, None
        entry = self.pool.catalog.find(request.model_id)
        if entry is not None:
            layers = placed_layers(entry.manifest, slot.placement if slot else None, planned)
            if not warm:
                size = self.pool.estimate(entry).mb
        return predict(warm=warm, loading=self.pool.is_loading(first),
                       ahead=ahead, parallel=slot.parallel if slot else 1,
                       load_s=learned.predicted_load_s(request.model_id, size),
                       infer_s=learned.predicted_infer_s(request.model_id, request.work,
                                                         layers))

    def _check_limits(self, request: QueuedRequest) -> None:
        """Refuse with 429 when the queue, the client's share of it, the model's or (under a
        key) its end user's share of it is full."""
        client_limit = min(self.settings.max_queued_per_client,
                           request.max_queued if request.max_queued is not None else 10**9)
        entry = self.pool.catalog.find(request.model_id)
        refusal = self._refusal(request.client_id, client_limit, request.model_id, (
            "model_queue_full", self._pending.of_model(request.model_id),
            entry.manifest.max_queued if entry else None, f"the queue for '{request.model_id}'"))
        if refusal is not None:
            raise refusal
        end_user = request.end_user_of_key
        limit = request.end_user_max_queued
        if end_user is not None and limit is not None:
            waiting = self._pending.of_end_user(*end_user)
            if waiting >= limit:
                self.events.emit("queue_rejected", model=request.model_id,
                                 client=request.client_id, reason="end_user_queue_full")
                raise RateLimited(
                    f"end user '{end_user[1]}' of key '{end_user[0]}' has its share of the "
                    f"queue full ({waiting} waiting, limit {limit})",
                    retry_after_s=self._retry_after(request.model_id),
                    code="end_user_queue_full")

    def refusal(self, client_id: str | None) -> RateLimited | None:
        """The 429 a request gets whatever its body says, known from its client's header
        alone: the queue is full, or that client's share of it is (a client profile only
        ever lowers the share), counting the requests on their way in (:attr:`arrivals`).
        Asked before the body is read, so a burst over the limits costs little; the full
        checks run again when the request is queued."""
        return self._refusal(client_id, self.settings.max_queued_per_client, None, None)

    def _refusal(self, client_id: str | None, client_limit: int, model_id: str | None,
                 of_model: tuple[str, int, int | None, str] | None) -> RateLimited | None:
        """``of_model`` None: at the gate, where the requests on their way in count too."""
        known = self.requestors.known(client_id) if client_id else None
        gate = of_model is None
        checks = [("queue_full", len(self._pending) + (self.arrivals.total if gate else 0),
                   self.settings.max_queue_depth, "the queue"),
                  ("client_queue_full", (known.queued if known else 0) + (
                      self.arrivals.by_client.get(client_id or "", 0) if gate else 0),
                   client_limit, f"client '{client_id}'s share of the queue"),
                  *([of_model] if of_model else [])]
        for code, waiting, limit, what in checks:
            if limit is not None and waiting >= limit:
                self.events.emit("queue_rejected", model=model_id or "", client=client_id,
                                 reason=code)
                return RateLimited(f"{what} is full ({waiting} waiting, limit {limit})",
                                   retry_after_s=self._retry_after(model_id), code=code)
        return None

    def _retry_after(self, model_id: str | None) -> float:
        """A hint from the learned inference time of the requests ahead (1–60 s)."""
        infer = (self.pool.learned.predicted_infer_s(model_id) if model_id else None) or 1.0
        return float(min(60, max(1, round(infer * len(self._pending) / 4))))
