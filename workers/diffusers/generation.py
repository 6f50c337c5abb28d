"""One generation: admitted by the holder, denoised to latents (with the request's LoRA
adapter on, if it names one), decoded per the VAE policy, returned as base64 PNGs, with
progress per denoising step and cancellation by ticket."""

from __future__ import annotations

import asyncio
import base64
import gc
import io
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..tickets import CancelOutcome, Ticket
from .edits import EditPipelines, edit_kwargs, edit_steps, steps_run
from .errors import CudaOutOfMemory, GenerationFailed, WorkerError
from .loader import LoadedPipeline
from .loras import applied, require_adapter
from .memory import (
    Offload,
    VaeDecision,
    VaeMode,
    cuda_free_mb,
    decide_vae,
    decode_latents,
    oom_fallback,
)
from .options import WorkerOptions
from .pipeline import PipelineHolder
from .references import reference_kwargs
from .schemas import GenerateRequest

log = logging.getLogger(__name__)
QUEUE_POLL_S = 0.05  # how often a queued generation looks at its ticket
# what runs under the weights lock: (its ticket, when it was queued) -> the answer
LockedWork = Callable[[Ticket, float], dict[str, Any]]


class Generator:
    """Runs generations on the holder's pipeline, one at a time, and reports their progress."""

    def __init__(self, holder: PipelineHolder) -> None:
        self.holder = holder
        self.edits = EditPipelines()  # img2img and inpainting, made from the loaded pipeline
        self._progress: dict[str, Any] = {"job": 0, "step": 0, "steps": 0, "state": "idle",
                                          "request_id": None}

    @property
    def options(self) -> WorkerOptions:
        """The holder's: a spare's generator learns its model's options at ``POST /load``."""
        return self.holder.options

    def progress(self) -> dict[str, Any]:
        """The ``GET /progress`` body: the running (or last) generation."""
        return dict(self._progress)

    def cancel(self, request_id: str | None = None) -> dict[str, Any]:
        """The ``POST /cancel`` answer: one generation by id (admitted or not yet), or, with no
        id, every admitted one. A cancel never outlives the generation it reached."""
        tickets = self.holder.tickets
        if request_id is None:
            ids = tickets.cancel_open()
            outcome = CancelOutcome.CANCELLING if ids else CancelOutcome.NONE
        else:
            outcome = tickets.cancel(request_id)
            ids = [request_id] if outcome is CancelOutcome.CANCELLING else []
        return {"cancelling": bool(ids), "request_ids": ids, "outcome": str(outcome)}

    async def generate(self, req: GenerateRequest) -> dict[str, Any]:
        """Admit (or refuse) at once, then denoise and decode images in a thread."""
        if self.holder.loaded is not None:  # an unknown adapter: a 400 before any queueing
            require_adapter(self.holder.loaded.loras, req.adapter)
        return await self.admitted(
            req.request_id, lambda ticket, queued: self._run_locked(ticket, req, queued))

    async def admitted(self, request_id: str | None, work: LockedWork) -> dict[str, Any]:
        """Admit (or refuse) at once, then run ``work`` in a thread under the weights lock (an
        image generation, or a video's: ``video.VideoGenerator``). The ticket is open from
        before the first await until the answer, so the weights cannot move under it."""
        ticket = self.holder.admit(request_id)
        try:
            return await asyncio.to_thread(self.run, ticket, work)
        except asyncio.CancelledError:
            ticket.cancel()  # the caller went away: stop denoising too
            raise
        except WorkerError:
            raise
        except Exception as exc:
            log.exception("generation %s failed", ticket.request_id)
            raise GenerationFailed(f"generation failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self.holder.release(ticket)

    def run(self, ticket: Ticket, work: LockedWork) -> dict[str, Any]:
        """Wait for the weights, then ``work``; ``Cancelled`` at any check."""
        queued = time.monotonic()
        while not self.holder.weights_lock.acquire(timeout=QUEUE_POLL_S):
            ticket.raise_if_cancelled()  # cancelled while queued: never starts
        try:
            return work(ticket, queued)
        finally:
            self.holder.weights_lock.release()

    def _run_locked(self, ticket: Ticket, req: GenerateRequest, queued: float) -> dict[str, Any]:
        import torch

        loaded = self.holder.loaded
        assert loaded is not None
        require_adapter(loaded.loras, req.adapter)  # admitted as the load ended: checked here
        started = time.monotonic()
        steps = steps_run(edit_steps(req.steps, req.strength), req.strength) \
            if req.image is not None else req.steps
        self._progress = {"job": self._progress["job"] + 1, "step": 0, "steps": steps,
                          "state": "running", "request_id": ticket.request_id}
        seed = req.seed if req.seed is not None else int.from_bytes(os.urandom(4), "big")
        step_ends: list[float] = []  # when each denoising step ended
        try:
            ticket.raise_if_cancelled()  # a cancel that came before the loop
            pipe, kwargs = self._pipeline(loaded, req, seed, self._on_step(ticket, step_ends))
            kwargs.update(reference_kwargs(loaded, req))  # IP-Adapter references, if any
            # the adapter sits in the loaded pipeline's UNet and text encoder, which an edit's
            # pipeline shares; on for this call only, under the weights lock we hold
            with applied(loaded.pipe, req.adapter, req.adapter_scale):
                latents = pipe(**kwargs).images
            denoised = time.monotonic()
            ticket.raise_if_cancelled()
            free = cuda_free_mb(_vae_device(loaded)) if loaded.device == "cuda" else None
            decision = decide_vae(req.width, req.height, self.options.vae_mb_per_512px, free,
                                  self.options.vram_margin_mb, self.options.allow_cpu_vae)
            images, decision = self._decode(loaded, latents, req, decision)
            finished = time.monotonic()
            ticket.raise_if_cancelled()  # a cancelled generation never answers 200
            self._progress["state"] = "done"
        except BaseException as exc:
            self._progress["state"] = "cancelled" if ticket.cancelled else "failed"
            if isinstance(exc, torch.cuda.OutOfMemoryError):
                gc.collect()
                torch.cuda.empty_cache()
                raise CudaOutOfMemory(f"CUDA out of memory: {exc}"[:500]) from exc
            raise
        finally:
            if loaded.hooks is Offload.MODEL:
                loaded.pipe.maybe_free_model_hooks()  # our own decode onloaded the VAE
        return {
            "images": [_png_b64(image) for image in images],
            "seed": seed, "device": loaded.device, "request_id": ticket.request_id,
            "timings": {"queue_s": round(started - queued, 4),
                        "denoise_s": round(denoised - started, 4),
                        "decode_s": round(finished - denoised, 4),
                        "total_s": round(finished - queued, 4),
                        # the steps run, and when each ended, from the start of denoising (the
                        # first's includes encoding the prompt)
                        "steps": len(step_ends),
                        "step_end_s": [round(end - started, 4) for end in step_ends]},
            "memory_decisions": decision.report(free),
        }

    def _pipeline(self, loaded: LoadedPipeline, req: GenerateRequest, seed: int,
                  on_step: Any) -> tuple[Any, dict[str, Any]]:
        """The pipeline to call and its arguments: the loaded one for a generation, the
        image-to-image or inpainting one made from it for an edit."""
        kwargs = _call_kwargs(loaded.call_params, req, seed, on_step)
        if req.image is None:
            return loaded.pipe, kwargs
        edit = self.edits.get(loaded.pipe, inpaint=req.mask is not None)
        kwargs = _call_kwargs(edit.call_params, req, seed, on_step)
        kwargs["num_inference_steps"] = edit_steps(req.steps, req.strength)
        extra = edit_kwargs(req.image, req.mask, req.strength, req.width, req.height)
        kwargs.update((k, v) for k, v in extra.items() if k in edit.call_params)
        return edit.pipe, kwargs

    @contextmanager
    def tracking(self, ticket: Ticket, steps: int,
                 ends: list[float] | None = None) -> Iterator[Any]:
        """``GET /progress`` for one run that brings its own pipeline call (a video's): running
        with ``steps``, then done, or cancelled / failed by what it raised. Yields the step
        callback, which counts the steps (noting when each ended in ``ends``) and stops the
        pipeline once the ticket is cancelled."""
        self._progress = {"job": self._progress["job"] + 1, "step": 0, "steps": steps,
                          "state": "running", "request_id": ticket.request_id}
        try:
            yield self._on_step(ticket, ends)
        except BaseException:
            self._progress["state"] = "cancelled" if ticket.cancelled else "failed"
            raise
        self._progress["state"] = "done"

    def _on_step(self, ticket: Ticket, ends: list[float] | None = None) -> Any:
        """The step callback: counts the steps (and, given ``ends``, notes when each ended)
        and stops the pipeline once the ticket is cancelled."""
        def on_step(pipe: Any, step: int, _timestep: Any, kwargs: dict) -> dict:
            self._progress["step"] = step + 1
            if ends is not None:
                ends.append(time.monotonic())
            if ticket.cancelled:
                pipe._interrupt = True  # what diffusers documents for stopping early
            return kwargs

        return on_step

    def _decode(self, loaded: LoadedPipeline, latents: Any, req: GenerateRequest,
                decision: VaeDecision) -> tuple[list[Any], VaeDecision]:
        import torch

        hooks = str(loaded.hooks) if loaded.hooks else None
        if decision.mode is VaeMode.CPU and hooks is not None:
            decision = decision._replace(mode=VaeMode.TILED, reason=decision.reason +
                                         f"; {hooks} offload owns the VAE, so tiled instead")
        device = _vae_device(loaded)
        try:
            return decode_latents(loaded.pipe, latents, req.width, req.height, decision.mode,
                                  device, hooks), decision
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            retry = oom_fallback(decision.mode, self.options.allow_cpu_vae, hooks is None)
            if retry is None:
                raise
            log.warning("CUDA out of memory decoding %dx%d (%s); retrying %s", req.width,
                        req.height, decision.mode, retry)
            retried = VaeDecision(retry, decision.estimated_mb, f"CUDA out of memory during "
                                  f"the {decision.mode} decode; retried {retry}")
            return decode_latents(loaded.pipe, latents, req.width, req.height, retry, device,
                                  hooks), retried


def _call_kwargs(call_params: frozenset[str], req: GenerateRequest, seed: int,
                 on_step: Any) -> dict[str, Any]:
    import torch

    wanted = {"prompt": req.prompt, "negative_prompt": req.negative_prompt,
              "width": req.width, "height": req.height, "num_inference_steps": req.steps,
              "guidance_scale": req.guidance, "num_images_per_prompt": req.n,
              "generator": torch.Generator(device="cpu").manual_seed(seed),
              "output_type": "latent", "callback_on_step_end": on_step}
    # not every pipeline takes every argument (FLUX.1 has no negative prompt)
    return {k: v for k, v in wanted.items() if k in call_params and v is not None}


def _vae_device(loaded: LoadedPipeline) -> Any:
    if loaded.hooks is not None:
        return loaded.device  # the hooks bring the weights to the execution device
    return next(loaded.pipe.vae.parameters()).device


def _png_b64(image: Any) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()
