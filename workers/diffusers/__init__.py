"""The diffusers worker: one text-to-image (or video) pipeline behind a small HTTP API.

Run as ``python -m workers.diffusers --model DIR --port N ...`` (flags in ``options``). The
pipeline loads in a background thread, so ``GET /health`` answers at once: 503 while loading or
after a failed load (with the error), 200 once loaded. ``POST /generate`` makes images while the
weights are on the device; ``POST /offload`` parks them in CPU RAM and ``POST /onload`` brings
them back, so the coordinator frees VRAM without a cold load from disk; a parked pipeline
refuses to generate (409 ``pipeline_offloaded``). ``POST /video`` makes a clip (an MP4) on a
video pipeline. ``POST /cancel`` stops a generation by request id (or every admitted one).
``POST /shutdown`` and SIGTERM stop the worker; it also dies with its parent (PR_SET_PDEATHSIG
and ``--parent-pid``).

Modules: ``app`` (routes), ``pipeline`` (the holder and its states), ``generation`` (one
generation), ``video`` (one video; ``media`` tells a video pipeline by its class name, holds
its frame rules, encodes MP4s and loads the LoRA adapters a request may turn on), ``tickets``
(admission and cancellation: the shared ``workers.tickets`` book with this worker's
refusals), ``loader`` (from_pretrained),
``memory`` (offload strategies, the VAE policy, memory probes), ``options`` (the command
line), ``errors``, ``schemas``; process lifetime is the shared ``workers.process``.
"""

from __future__ import annotations

from ..tickets import CancelOutcome, Ticket
from .app import create_app
from .errors import WorkerError
from .generation import Generator
from .loader import LoadedPipeline, load_pipeline
from .options import WorkerOptions, parse_args
from .pipeline import TRANSITIONS, PipelineHolder, PipelineState, check_transition
from .schemas import CancelRequest, GenerateRequest
from .tickets import TicketBook
from .video import VideoGenerator, VideoRequest

__all__ = [
    "TRANSITIONS",
    "CancelOutcome",
    "CancelRequest",
    "GenerateRequest",
    "Generator",
    "LoadedPipeline",
    "PipelineHolder",
    "PipelineState",
    "Ticket",
    "TicketBook",
    "VideoGenerator",
    "VideoRequest",
    "WorkerError",
    "WorkerOptions",
    "check_transition",
    "create_app",
    "load_pipeline",
    "parse_args",
]
