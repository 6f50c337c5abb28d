"""The open realtime sessions of one coordinator. Opening one plans its pipeline's three models
together (:func:`~model_boss.scheduling.planner.together`: they fit at once, else the session
is refused naming the model that cannot fit and why), then holds each while the session is
open (it counts as a user of each: no idle unload, and only a request more important than the
session evicts one) and starts the loads of those not ready, so the first turn finds them
warm. Closing it lets them go; a stop of the daemon ends every session first."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...errors import CapacityExceeded
from ...scheduling import planner
from ...scheduling.states import SlotState
from ...slot_key import slot_key
from ..accounting import who
from ..extensions import Extensions
from ..serving import effective_priority

if TYPE_CHECKING:
    from ...catalog.manifest import PipelineSpec
    from ...coordinator import Coordinator
    from .session import RealtimeSession

log = logging.getLogger(__name__)


@dataclass(eq=False)
class OpenSession:
    """One session as the registry (and ``ps``, the dashboard) sees it."""

    session: RealtimeSession
    models: tuple[str, ...]  # the ids of the slots it holds (aliases and adapters resolved)
    key: str
    end_user: str
    priority: int
    opened_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        s = self.session
        return {"id": s.id, "model": s.model, "key": self.key, "end_user": self.end_user,
                "priority": self.priority, "opened_at": self.opened_at, "turns": s.responses,
                "responding": s.responding, "models": list(self.models)}


class OpenSessions:
    """Every open realtime session (see the module's docstring)."""

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self.open: dict[str, OpenSession] = {}

    def priority(self, ext: Extensions) -> int:
        """The priority a session's turns run at: as its key's requests run (the key's
        profile, its floor), or the priority it asked for."""
        asker = who(self.coord, ext, {})
        return effective_priority(self.coord.settings, ext.priority, asker.profile)

    async def check_fit(self, pipeline: PipelineSpec, priority: int) -> None:
        """Refuse (503 ``capacity_exceeded``, naming the model) a pipeline whose models
        cannot be resident at once at ``priority``, before the session takes any audio."""
        pool = self.coord.pool
        demands = [pool.demand(self.coord.catalog.get(model_id), priority)
                   for model_id in self.slots_of(pipeline)]
        refused = planner.together(demands, await pool.snapshot())
        if refused is not None:
            raise CapacityExceeded(f"the pipeline's models cannot be on the GPUs together: "
                                   f"{refused.reason}", param="model", retry_after_s=30)

    def slots_of(self, pipeline: PipelineSpec) -> tuple[str, ...]:
        """The models whose slots serve ``pipeline`` (an alias: its model; an adapter: its
        base), each once."""
        catalog = self.coord.catalog
        return tuple(dict.fromkeys(catalog.base_of(catalog.get(name).manifest.id)
                                   for name in pipeline.members))

    def add(self, session: RealtimeSession, ext: Extensions, priority: int) -> None:
        """Hold the session's models and start loading those not ready."""
        asker = who(self.coord, ext, {})
        models = self.slots_of(session.pipeline)
        self.open[session.id] = OpenSession(session, models, asker.key, asker.end_user,
                                            priority)
        for model_id in models:
            owner = self.coord.pool.owner(model_id)
            owner.hold(session.id, priority)
            if owner.slot.state != SlotState.READY:
                task = owner.start_load(priority)
                if task is not None:
                    task.add_done_callback(_quiet_failure)
        self.coord.events.emit("realtime_session_opened", session=session.id,
                               model=session.model, key=asker.key, priority=priority)

    async def remove(self, session: RealtimeSession) -> None:
        """End the session's response, if any, and let its models go."""
        entry = self.open.pop(session.id, None)
        if entry is None:
            return
        try:
            await session.close()
        finally:
            for model_id in entry.models:
                owner = self.coord.pool.owners.get(slot_key(model_id))
                if owner is not None:
                    owner.let_go(session.id)
            self.coord.events.emit("realtime_session_closed", session=session.id,
                                   model=session.model, responses=session.responses)

    async def end_all(self) -> None:
        """A stop: every session is told and ended (its socket closes)."""
        await asyncio.gather(*(entry.session.end("the server is stopping")
                               for entry in list(self.open.values())),
                             return_exceptions=True)

    def status(self) -> list[dict[str, Any]]:
        return [entry.to_dict() for entry in self.open.values()]


def _quiet_failure(task: asyncio.Task) -> None:
    """A warm-up load that failed: the session's first turn meets the same error."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("realtime warm-up load failed: %s", task.exception())
