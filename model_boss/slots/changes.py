"""A reloaded catalog reaching the slots: each changed model's owner takes its new entry, and
a worker whose model is gone or runs with changed flags is drained, then stopped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from ..catalog import CatalogDiff
from ..errors import ModelBossError
from ..slot_key import SlotKey
from .slot import SlotState

if TYPE_CHECKING:
    from .pool import ModelPool

log = logging.getLogger(__name__)


async def take_catalog_change(pool: ModelPool, diff: CatalogDiff, drain_s: float) -> None:
    """Bring the slots in line with ``pool.catalog`` (already the new one). Running requests
    finish (up to ``drain_s``); a model still loading is waited for, then stopped. Loads
    started from now on read the new catalog, so a removed model never loads again."""
    work = []
    for model_id in diff.changed:
        entry = pool.catalog.find(model_id)
        for owner in pool.replicas(model_id) if entry is not None else []:
            owner.slot.adopt(entry, pool.stay_warm_for(entry))
            if model_id in diff.restart:
                work.append(_retire(pool, owner.key, "manifest changed", drain_s,
                                    forget=False))
    for model_id in diff.removed:
        for owner in pool.replicas(model_id):
            work.append(_retire(pool, owner.key, "removed from the catalog", drain_s,
                                forget=True))
    await asyncio.gather(*work)
    pool.prune_replicas()
    pool.on_change()


async def _retire(pool: ModelPool, key: SlotKey, reason: str, drain_s: float,
                  forget: bool) -> None:
    """Stop the copy ``key``; ``forget``: its model left the catalog, so its slot goes too."""
    owner = pool.owners[key]
    try:
        if await owner.unload(reason, wait_s=drain_s, wait_for_op=True):
            log.info("'%s' stopped: %s", key, reason)
    except ModelBossError as exc:  # still busy after the drain: it stops at its next idle
        log.warning("'%s' (%s) could not be stopped now: %s", key, reason, exc.message)
    if forget and owner.slot.state == SlotState.IDLE and not owner.busy \
            and not owner.waiters and pool.catalog.find(owner.model_id) is None:
        with contextlib.suppress(KeyError):
            del pool.owners[key]
            del pool.slots[key]
        pool.events.emit("model_removed", model=owner.model_id, replica=key)
