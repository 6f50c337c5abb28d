"""The diffusers worker's pipeline holder: one transition table (legal and illegal moves),
admission by state, moves refused while generating, and cancellation by ticket."""

from __future__ import annotations

import asyncio
import itertools
import threading
from typing import Any

import pytest

from workers.diffusers import (
    TRANSITIONS,
    CancelOutcome,
    LoadedPipeline,
    PipelineHolder,
    PipelineState,
    TicketBook,
    WorkerOptions,
    check_transition,
)
from workers.diffusers.errors import (
    Busy,
    Cancelled,
    CudaOutOfMemory,
    DuplicateRequestId,
    IllegalTransition,
    MoveFailed,
    NotReady,
    PipelineOffloaded,
    WorkerError,
)
from workers.diffusers.options import InvalidOptions, load_args

P = PipelineState
LEGAL = {
    (P.SPARE, P.LOADING),
    (P.LOADING, P.READY), (P.LOADING, P.FAILED),
    (P.READY, P.OFFLOADING),
    (P.OFFLOADING, P.OFFLOADED), (P.OFFLOADING, P.READY), (P.OFFLOADING, P.FAILED),
    (P.OFFLOADED, P.ONLOADING),
    (P.ONLOADING, P.READY), (P.ONLOADING, P.OFFLOADED), (P.ONLOADING, P.FAILED),
}


def test_table_matches_the_documented_lifecycle():
    assert {(a, b) for a, targets in TRANSITIONS.items() for b in targets} == LEGAL
    assert set(TRANSITIONS) == set(P)
    assert TRANSITIONS[P.FAILED] == frozenset()  # final


@pytest.mark.parametrize("old, new", sorted(itertools.product(P, P)))
def test_every_pair(old, new):
    if (old, new) in LEGAL:
        check_transition(old, new)
    else:
        with pytest.raises(IllegalTransition) as caught:
            check_transition(old, new)
        assert caught.value.status == 500 and f"{old} -> {new}" in str(caught.value)


# -- the holder, over a fake pipeline ------------------------------------------------------


class FakePipe:
    """Records ``to()`` moves; a move can be held at a gate, and the next ``failures`` moves
    raise ``error``."""

    def __init__(self) -> None:
        self.moves: list[str] = []
        self.failures = 0
        self.error: type[Exception] = RuntimeError
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def to(self, device: str, **_kwargs: Any) -> FakePipe:
        self.entered.set()
        assert self.gate.wait(10)
        if self.failures:
            self.failures -= 1
            raise self.error(f"cannot move to {device}")
        self.moves.append(device)
        return self


def fake_loaded(pipe: FakePipe) -> LoadedPipeline:
    return LoadedPipeline(pipe=pipe, device="cpu", dtype="float32", hooks=None,
                          footprint_mb=7, load_s=0.1, ready_s=1.0, call_params=frozenset())


def loaded_holder(pipe: FakePipe | None = None) -> PipelineHolder:
    holder = PipelineHolder(WorkerOptions(model="tiny", port=0))
    holder.start_loading(lambda: fake_loaded(pipe or FakePipe())).join(5)
    assert holder.state is P.READY
    return holder


def failed_holder() -> PipelineHolder:
    def broken() -> LoadedPipeline:
        raise OSError("no model_index.json")

    holder = PipelineHolder(WorkerOptions(model="missing", port=0))
    holder.start_loading(broken).join(5)
    return holder


async def holder_in(state: PipelineState) -> tuple[PipelineHolder, FakePipe, asyncio.Task | None]:
    """A holder brought to ``state`` through its public API; a move in flight is held at the
    pipe's gate (the returned task finishes it once the gate opens)."""
    pipe = FakePipe()
    if state is P.SPARE:
        return PipelineHolder(WorkerOptions(model="", port=0, spare=True)), pipe, None
    if state is P.LOADING:
        return PipelineHolder(WorkerOptions(model="tiny", port=0)), pipe, None
    if state is P.FAILED:
        return failed_holder(), pipe, None
    holder = loaded_holder(pipe)
    task = None
    if state in (P.OFFLOADED, P.ONLOADING):
        await holder.offload()
    if state in (P.OFFLOADING, P.ONLOADING):
        pipe.gate.clear()
        pipe.entered.clear()
        task = asyncio.create_task(holder.offload() if state is P.OFFLOADING
                                   else holder.onload())
        await asyncio.to_thread(pipe.entered.wait, 5)
    assert holder.state is state
    return holder, pipe, task


ADMISSION = [
    (P.SPARE, NotReady),
    (P.LOADING, NotReady),
    (P.READY, None),
    (P.OFFLOADING, PipelineOffloaded),
    (P.OFFLOADED, PipelineOffloaded),
    (P.ONLOADING, PipelineOffloaded),
    (P.FAILED, NotReady),
]


@pytest.mark.parametrize("state, refusal", ADMISSION)
async def test_generations_are_admitted_only_when_ready(state, refusal):
    holder, pipe, task = await holder_in(state)
    try:
        if refusal is None:
            ticket = holder.admit("r1")
            assert holder.report()["generating"] is True
            holder.release(ticket)
            assert holder.report()["generating"] is False
        else:
            with pytest.raises(refusal):
                holder.admit("r1")
            assert len(holder.tickets) == 0
    finally:
        pipe.gate.set()
        if task is not None:
            await task


def test_offloaded_refusal_is_a_409_invalid_request():
    body = PipelineOffloaded("the pipeline is offloaded").body()
    assert PipelineOffloaded.status == 409
    assert body["error"]["code"] == "pipeline_offloaded"
    assert body["error"]["type"] == "invalid_request_error"


MOVES = [  # (state, verb, outcome): the error class, or the state it ends in
    (P.SPARE, "offload", NotReady), (P.SPARE, "onload", NotReady),
    (P.LOADING, "offload", NotReady), (P.LOADING, "onload", NotReady),
    (P.FAILED, "offload", NotReady), (P.FAILED, "onload", NotReady),
    (P.READY, "offload", P.OFFLOADED), (P.READY, "onload", P.READY),
    (P.OFFLOADED, "offload", P.OFFLOADED), (P.OFFLOADED, "onload", P.READY),
    (P.OFFLOADING, "offload", Busy), (P.OFFLOADING, "onload", Busy),
    (P.ONLOADING, "offload", Busy), (P.ONLOADING, "onload", Busy),
]


@pytest.mark.parametrize("state, verb, outcome", MOVES)
async def test_moves_by_state(state, verb, outcome):
    holder, pipe, task = await holder_in(state)
    try:
        move = holder.offload if verb == "offload" else holder.onload
        if isinstance(outcome, type) and issubclass(outcome, WorkerError):
            with pytest.raises(outcome):
                await move()
            assert holder.state is state
        else:
            answer = await move()
            assert holder.state is outcome
            assert answer["tier"] == ("cpu" if outcome is P.OFFLOADED else "gpu")
    finally:
        pipe.gate.set()
        if task is not None:
            await task


@pytest.mark.parametrize("verb", ["offload", "onload"])
async def test_moves_refused_while_a_generation_is_admitted(verb):
    pipe = FakePipe()
    holder = loaded_holder(pipe)
    ticket = holder.admit("running")
    with pytest.raises(Busy):
        await (holder.offload() if verb == "offload" else holder.onload())
    assert holder.state is P.READY and pipe.moves == []
    holder.release(ticket)
    await holder.offload()
    assert holder.state is P.OFFLOADED and pipe.moves == ["cpu"]


async def test_offload_blocks_generations_before_its_first_await():
    pipe = FakePipe()
    holder = loaded_holder(pipe)
    pipe.gate.clear()
    task = asyncio.create_task(holder.offload())
    await asyncio.sleep(0)  # the task ran up to its first await: the move is in a thread
    assert holder.state is P.OFFLOADING
    with pytest.raises(PipelineOffloaded):
        holder.admit()
    pipe.gate.set()
    assert (await task)["freed_mb"] == 7  # CPU-only: the footprint the coordinator frees
    assert holder.report()["transitions"] == ["loading->ready", "ready->offloading",
                                              "offloading->offloaded"]


class OutOfMemoryError(RuntimeError):
    """Named as torch.cuda.OutOfMemoryError is."""


# The fake pipeline computes on "cpu", so a move and its undo are both moves to "cpu":
# one failure is a failed move put right, two leave the weights nowhere known.
@pytest.mark.parametrize("verb, failures, error, raised, ends_in", [
    ("offload", 1, RuntimeError, MoveFailed, P.READY),
    ("offload", 2, RuntimeError, MoveFailed, P.FAILED),
    ("onload", 1, RuntimeError, MoveFailed, P.OFFLOADED),
    ("onload", 2, RuntimeError, MoveFailed, P.FAILED),
    ("onload", 1, OutOfMemoryError, CudaOutOfMemory, P.OFFLOADED),
])
async def test_a_failed_move_is_undone_or_fails_the_pipeline(verb, failures, error, raised,
                                                              ends_in):
    pipe = FakePipe()
    holder = loaded_holder(pipe)
    if verb == "onload":
        await holder.offload()
    pipe.failures, pipe.error = failures, error
    with pytest.raises(raised):
        await (holder.offload() if verb == "offload" else holder.onload())
    assert holder.state is ends_in
    if ends_in is P.FAILED:
        assert "undoing it failed" in holder.error
        with pytest.raises(NotReady):
            holder.admit()


def test_failed_load_keeps_the_error():
    holder = failed_holder()
    assert holder.state is P.FAILED and holder.error == "OSError: no model_index.json"
    assert holder.report()["loads_from_disk"] == 0


# -- tickets: cancel targets one generation and dies with it --------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_cancel_before_the_generation_starts_is_kept_on_its_ticket():
    book = TicketBook()
    ticket = book.open("a")
    assert book.cancel("a") is CancelOutcome.CANCELLING
    with pytest.raises(Cancelled):  # checked when it gets the weights, before the loop
        ticket.raise_if_cancelled()


def test_a_stale_cancel_does_not_reach_the_next_generation():
    book = TicketBook()
    first = book.open("a")
    book.close(first)
    assert book.cancel_open() == []  # between two jobs: nothing admitted, nothing kept
    assert book.cancel("a") is CancelOutcome.FINISHED
    for request_id in (None, "a"):
        ticket = book.open(request_id)
        assert not ticket.cancelled
        book.close(ticket)


def test_untargeted_cancel_reaches_every_admitted_generation_only():
    book = TicketBook()
    a, b = book.open("a"), book.open("b")
    assert sorted(book.cancel_open()) == ["a", "b"]
    assert a.cancelled and b.cancelled
    book.close(a)
    book.close(b)
    assert not book.open("c").cancelled


def test_targeted_cancel_leaves_the_others_alone():
    book = TicketBook()
    a, b = book.open("a"), book.open("b")
    book.cancel("b")
    assert b.cancelled and not a.cancelled


@pytest.mark.parametrize("wait_s, cancelled", [(0.0, True), (59.0, True), (61.0, False)])
def test_a_cancel_that_overtakes_its_generation_is_remembered_briefly(wait_s, cancelled):
    clock = Clock()
    book = TicketBook(remember_s=60, clock=clock)
    assert book.cancel("early") is CancelOutcome.REMEMBERED
    clock.now += wait_s
    assert book.open("early").cancelled is cancelled


def test_remembered_cancels_are_bounded_and_used_once():
    book = TicketBook(remember_max=2)
    for request_id in ("x", "y", "z"):
        book.cancel(request_id)
    assert not book.open("x").cancelled  # the oldest was dropped
    assert book.open("z").cancelled
    book.close(book.open("y"))
    assert not book.open("y").cancelled  # consumed by its first generation


def test_a_request_id_is_admitted_once_at_a_time():
    book = TicketBook()
    ticket = book.open("a")
    with pytest.raises(DuplicateRequestId):
        book.open("a")
    book.close(ticket)
    book.close(ticket)  # closing twice is harmless
    assert book.open("a") is not ticket
    assert book.open().request_id.startswith("gen-")


def test_a_spare_takes_one_model_once():
    holder = PipelineHolder(WorkerOptions(model="", port=0, spare=True))
    assert holder.state is P.SPARE and holder.report()["state"] == "spare"
    holder.assign(WorkerOptions(model="tiny", port=0))
    assert holder.state is P.LOADING and holder.options.model == "tiny"
    with pytest.raises(Busy):
        holder.assign(WorkerOptions(model="other", port=0))
    assert holder.options.model == "tiny"


def test_a_loaded_worker_is_no_spare():
    with pytest.raises(Busy):
        loaded_holder(FakePipe()).assign(WorkerOptions(model="other", port=0))


@pytest.mark.parametrize("flags, error", [
    ([], "--model is required"),
    (["--model", "m", "--port", "9"], "own"),
    (["--model", "m", "--api-key=x"], "own"),
    (["--model", "m", "--dtype", "float8"], "invalid choice"),
    (["--model", "m", "--vae-mb-per-512px", "0"], "positive"),
])
def test_load_args_refuse_what_is_not_a_model_flag(flags, error):
    spare = WorkerOptions(model="", port=7, parent_pid=3, api_key="k", spare=True)
    with pytest.raises(InvalidOptions, match=error):
        load_args(spare, flags)


def test_load_args_keep_the_spares_address_parent_and_key():
    spare = WorkerOptions(model="", port=7, host="127.0.0.1", parent_pid=3, api_key="k",
                          spare=True)
    options = load_args(spare, ["--model", "/m", "--dtype", "float32", "--offload", "model"])
    assert (options.model, options.port, options.parent_pid, options.api_key) == \
        ("/m", 7, 3, "k")
    assert options.dtype == "float32" and str(options.offload) == "model"
    assert options.spare is False
