"""Lookups by model in the services, over a model whose first copy is gone and whose second
(``m#2``) serves: any copy counts where any copy is meant (the worker's ``/slots``, the load a
request waits on, the loaded diffusion models listed first)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from model_boss.catalog import BackendKind, Category
from model_boss.services import load_wait, worker_slots
from model_boss.services.media.sdapi import picture_models
from model_boss.slot_key import model_of
from model_boss.slots.slot import SlotState


def copies(states: dict[str, SlotState], loading: str | None = None) -> SimpleNamespace:
    """A pool of slots ``states`` (copy key -> state); the copy ``loading`` has a load on
    its way."""
    progress = SimpleNamespace(snapshot=lambda: {"stage": "weights", "fraction": 0.5,
                                                 "elapsed_s": 1.0})
    owners = {key: SimpleNamespace(slot=SimpleNamespace(key=key, state=state,
                                                        backend=f"worker of {key}"),
                                   progress=progress if key == loading else None)
              for key, state in states.items()}
    return SimpleNamespace(
        slots={key: o.slot for key, o in owners.items()}, owners=owners,
        replicas=lambda model: [o for key, o in owners.items() if model_of(key) == model])


async def test_slots_are_read_from_the_copy_that_runs(monkeypatch):
    asked = []

    async def worker_get(backend, model_id, path):
        asked.append(backend)
        return SimpleNamespace(content=b"[]")

    monkeypatch.setattr(worker_slots, "worker_get", worker_get)

    async def resolve(model, task=None):
        return SimpleNamespace(candidates=["m"])

    coord = SimpleNamespace(router=SimpleNamespace(resolve=resolve),
                            pool=copies({"m": SlotState.IDLE, "m#2": SlotState.READY}))
    served = await worker_slots.worker_slots(coord, "m")
    assert served.status == 200 and asked == ["worker of m#2"]


@pytest.mark.parametrize("loading", ["m", "m#2"])
def test_a_waiter_is_told_of_the_load_of_any_copy(loading):
    request = SimpleNamespace(request_id="r1", model_id="m")
    coord = SimpleNamespace(queue=SimpleNamespace(ordered=lambda: [request]),
                            pool=copies({"m": SlotState.READY, "m#2": SlotState.LOADING}
                                        if loading == "m#2" else {"m": SlotState.LOADING},
                                        loading))
    model, line = load_wait.loading_line(coord, "r1")
    assert model == "m" and line is not None and b"stage=weights 50%" in line


def test_a_model_with_a_second_copy_only_is_listed_among_the_loaded():
    def entry(model_id):
        return SimpleNamespace(available=True, manifest=SimpleNamespace(
            id=model_id, backend=BackendKind.DIFFUSERS, category=Category.DIFFUSION))

    coord = SimpleNamespace(catalog=[entry("a"), entry("b")],
                            pool=copies({"b#2": SlotState.READY}))
    assert picture_models(coord) == ["b", "a"]
