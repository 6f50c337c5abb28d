"""DiffusersBackend: ``python -m workers.diffusers`` — pictures (generations and edits, with
references where the model has an IP-Adapter) or clips, with a CPU-RAM tier."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import time
import uuid
from typing import Any

import httpx
import orjson

from ..catalog.manifest import Category, ModelManifest
from ..endpoints import EDITS, IMAGES, VIDEOS
from ..errors import BadRequest
from ..gpu.placement import Placement
from .base import HttpWorkerBackend, UpstreamResponse
from .spare import DIFFUSERS, TakesSpares, torch_defaults

VIDEO_HEADER = "x-model-boss-video"  # a clip's frames, fps, size, seed and timings (JSON)
_BACKGROUND: set[asyncio.Task] = set()
WORKER_FIELDS = ("prompt", "negative_prompt", "width", "height", "steps", "guidance", "seed", "n",
                 "image", "mask", "strength", "reference_images", "reference_strength",
                 "adapter", "adapter_scale")
VIDEO_FIELDS = ("prompt", "negative_prompt", "width", "height", "steps", "guidance", "seed",
                "frames", "fps", "image")
DEFAULT_SECONDS = 4.0  # a clip that names no length (OpenAI's default)
# the worker's route for each endpoint, and the fields it takes
_ROUTES = {IMAGES: ("/generate", WORKER_FIELDS), EDITS: ("/generate",
                                                                          WORKER_FIELDS),
           VIDEOS: ("/video", VIDEO_FIELDS)}


class DiffusersBackend(TakesSpares, HttpWorkerBackend):
    """Spawns the diffusers worker (or takes the spare one); offload/onload move the pipeline
    between VRAM and RAM."""

    spare_kind = DIFFUSERS
    can_offload = True
    health_path = "/health"
    secret_env = "WORKER_API_KEY"  # workers/diffusers/options.py reads it

    @staticmethod
    def serves(manifest: ModelManifest) -> list[str]:
        """The endpoints a pipeline answers (checked before it is loaded): a video pipeline
        the videos API, any other pictures, made and edited."""
        if manifest.category == Category.VIDEO:
            return [VIDEOS]
        return [IMAGES, EDITS]

    def argv(self, port: int, placement: Placement | None) -> list[str]:
        return [sys.executable, "-m", "workers.diffusers", "--host", "127.0.0.1",
                "--port", str(port), "--parent-pid", str(os.getpid()),
                *self.model_flags(placement)]

    def model_flags(self, placement: Placement | None) -> list[str]:
        """The model's flags: a cold start's argv, a spare's ``POST /load``."""
        m = self.manifest
        flags = ["--model", str(self.entry.path), "--device", "auto",
                 "--dtype", m.dtype, "--offload", m.offload,
                 "--vae-mb-per-512px", f"{m.vae_mb_per_512px:g}",
                 "--vram-margin-mb", str(self.settings.vram_margin_mb)]
        flags.append("--allow-cpu-vae" if m.allow_cpu_vae else "--no-allow-cpu-vae")
        if self.entry.ip_adapter is not None:
            flags += ["--ip-adapter", str(self.entry.ip_adapter)]
        for adapter in self.entry.adapters:  # LoRAs, applied per request (catalog/adapters.py)
            flags += ["--lora", f"{adapter.worker_name}={adapter.path}"]
        if m.offload == "balanced" and placement is not None and len(placement.gpus) > 1:
            # CUDA_VISIBLE_DEVICES renumbers the chosen GPUs from 0
            memory = {str(i): f"{mb}MiB" for i, mb in
                      enumerate(placement.allocations[g] for g in placement.gpus)}
            flags += ["--max-memory", json.dumps(memory)]
        return flags + list(m.args)

    def environment(self, placement: Placement | None) -> dict[str, str]:
        env = super().environment(placement)
        torch_defaults(env)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        return env

    def loading_stage(self, response: httpx.Response) -> tuple[str, float | None]:
        """The worker's ``/health`` while loading says how many pipeline components are in."""
        try:
            load = response.json().get("load") or {}
        except (ValueError, AttributeError):
            load = {}
        fraction = load.get("fraction")
        return "loading", float(fraction) if isinstance(fraction, int | float) else None

    async def handle_request(self, endpoint: str, body: dict[str, Any],
                             stream: bool) -> UpstreamResponse:
        if endpoint not in self.serves(self.manifest):
            raise BadRequest(f"'{self.manifest.id}' is a {self.manifest.category} model; it "
                             f"serves {', '.join(self.serves(self.manifest))}", param="model",
                             code="unsupported_endpoint")
        route, fields = _ROUTES[endpoint]
        if endpoint == VIDEOS:  # seconds at the manifest's frame rate, or the asked
            fps = body.get("fps") or self.manifest.fps
            seconds = body.get("seconds") or DEFAULT_SECONDS
            body = {**body, "fps": fps, "frames": max(1, round(seconds * fps))}
        worker_body = {k: body[k] for k in fields if body.get(k) is not None}
        worker_body["request_id"] = request_id = uuid.uuid4().hex
        try:
            answer = await self.proxy("POST", route, worker_body, stream=False)
        except asyncio.CancelledError:
            # the caller went away (client disconnect, job cancelled): stop denoising too;
            # by id, so a cancel that overtakes its generation still stops it, and only it
            task = asyncio.create_task(self.control("/cancel", {"request_id": request_id}))
            _BACKGROUND.add(task)
            task.add_done_callback(_BACKGROUND.discard)
            raise
        result = orjson.loads(answer.body or b"{}")
        if endpoint == VIDEOS:  # the clip as it is, its figures in a header
            figures = {k: result.get(k) for k in ("frames", "fps", "width", "height", "seed",
                                                  "timings")}
            return UpstreamResponse(200, {"content-type": "video/mp4",
                                          VIDEO_HEADER: orjson.dumps(figures).decode()},
                                    body=base64.b64decode(result.get("video") or ""))
        data = [{"b64_json": image, "revised_prompt": body.get("prompt")}
                for image in result.get("images", [])]
        out = {"created": int(time.time()), "data": data,
               "x_model_boss": {k: result.get(k) for k in
                                ("seed", "timings", "memory_decisions", "device")}}
        return UpstreamResponse(200, {"content-type": "application/json"},
                                body=orjson.dumps(out))

    async def offload(self) -> dict[str, Any]:
        return await self.control("/offload")

    async def onload(self) -> dict[str, Any]:
        return await self.control("/onload")

    async def report(self) -> dict[str, Any]:
        return await self.worker_report("/health", timeout_s=5)

    async def progress(self) -> dict[str, Any]:
        return await self.worker_report("/progress", timeout_s=2)
