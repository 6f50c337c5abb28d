"""ModelRouter: a model id, alias or task → the candidates to try, best first.

Every resolution goes through :func:`_pick_best_candidate`, the single chokepoint where
ladder position, warm state, placeability and the cloud-fallback guard are weighed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..catalog import BackendKind, Catalog
from ..catalog.tasks import TaskRegistry, TaskSpec, task_name
from ..errors import BadRequest, Forbidden, ModelBossError
from ..runtime_config import RuntimeConfig
from ..settings import ClientProfile
from ..slot_key import slot_key
from ..tenancy.keys import model_in_scope
from .seams import SlotBoard
from .states import SlotState

CLOUD_PREFIXES = ("claude:", "cloud:", "openai:")


@dataclass(frozen=True, slots=True)
class Candidate:
    """What the picker knows about one rung of a ladder."""

    model_id: str
    position: int
    cloud: bool = False
    available: bool = True
    warm: bool = False
    placeable: bool = True


@dataclass(slots=True)
class RoutePlan:
    """The models to try, in order, and the task they came from (if any)."""

    candidates: list[str]
    task: TaskSpec | None = None
    stripped: list[str] = field(default_factory=list)

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.task.params) if self.task else {}


def _pick_best_candidate(candidates: list[Candidate], *, pin_first: bool = False,
                         allow_cloud_fallback: bool = True) -> tuple[list[Candidate],
                                                                     list[Candidate]]:
    """Order ``candidates`` best first; return (order, stripped by the cloud guard).

    The guard: with cloud fallback off, cloud candidates at positions >= 1 are removed;
    position 0 never is, so the list never empties. ``pin_first`` keeps ladder order (the
    primary first, the rest as fallbacks). Otherwise: available before unavailable, warm
    (READY) before cold, placeable now before waiting, then ladder position.
    """
    kept, stripped = [], []
    for candidate in sorted(candidates, key=lambda c: c.position):
        if candidate.cloud and candidate.position > 0 and not allow_cloud_fallback:
            stripped.append(candidate)
        else:
            kept.append(candidate)
    if pin_first:
        return kept, stripped
    order = sorted(kept, key=lambda c: (not c.available, not c.warm, not c.placeable,
                                        c.position))
    return order, stripped


def is_cloud(catalog: Catalog, model_id: str) -> bool:
    entry = catalog.find(model_id)
    return model_id.startswith(CLOUD_PREFIXES) or (
        entry is not None and entry.manifest.backend == BackendKind.CLOUD)


class ModelRouter:
    """Resolves what a request asked for into a :class:`RoutePlan`."""

    def __init__(self, catalog: Catalog, tasks: TaskRegistry, pool: SlotBoard,
                 runtime: RuntimeConfig) -> None:
        self.catalog = catalog
        self.tasks = tasks
        self.pool = pool
        self.runtime = runtime

    async def resolve(self, model: str | None, *, task: str | None = None,
                      priority: int = 5, profile: ClientProfile | None = None) -> RoutePlan:
        name = task or task_name(model)
        if name is None and not model and profile and profile.default_task:
            name = profile.default_task
        if name is not None:
            spec = self.tasks.get(name)
            ladder, pin_first = list(spec.candidates), spec.pin_primary
        else:
            if not model:
                raise BadRequest("'model' is required", param="model", code="missing_field")
            ladder, spec, pin_first = [self.catalog.get(model).manifest.id], None, True
        if profile and profile.allowed_models is not None:  # names or globs
            permitted = [m for m in ladder
                         if model_in_scope(profile, self.catalog.get(m).manifest.names)]
            if not permitted:
                raise Forbidden(f"this client may not use '{model or name}'", param="model")
            ladder = permitted
        if spec is None:  # a direct request: one candidate, always honoured
            return RoutePlan(ladder)
        views = [await self._view(model_id, position, priority)
                 for position, model_id in enumerate(ladder)]
        order, stripped = _pick_best_candidate(
            views, pin_first=pin_first,
            allow_cloud_fallback=self.runtime.allow_cloud_fallback)
        return RoutePlan([c.model_id for c in order], spec, [c.model_id for c in stripped])

    async def _view(self, model_id: str, position: int, priority: int) -> Candidate:
        entry = self.catalog.get(model_id)
        slot = self.pool.slots.get(slot_key(model_id))  # its first copy
        warm = slot is not None and slot.state == SlotState.READY
        available, placeable = True, warm
        try:
            self.catalog.get_available(model_id)
        except ModelBossError:
            available = False
        if available and not warm:
            try:
                placeable = (await self.pool.plan(slot_key(model_id), priority)).can_start
            except ModelBossError:
                placeable = False
        return Candidate(entry.manifest.id, position, is_cloud(self.catalog, model_id),
                         available, warm, placeable)
