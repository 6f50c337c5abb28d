"""The diffusers worker: one text-to-image pipeline behind a small HTTP API.

    python -m workers.diffusers_worker --model DIR --port N [--device auto|cuda|cpu]
        [--dtype auto|float16|bfloat16|float32] [--offload none|model|sequential|group|balanced]
        [--max-memory JSON] [--vae-mb-per-512px 1600] [--no-allow-cpu-vae]
        [--vram-margin-mb 512] [--parent-pid PID]

``GET /health`` answers 200 once the pipeline is loaded (503 with the state before, or with the
error after a failed load). ``POST /generate`` makes images; ``POST /offload`` parks the
weights in CPU RAM and ``POST /onload`` brings them back, so the coordinator can free VRAM
without a cold load from disk. ``GET /progress`` follows the denoising steps.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import ctypes
import gc
import io
import json
import logging
import os
import signal
import sys
import threading
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from workers.diffusion_memory import (
    VaeDecision,
    decide_vae,
    pipeline_footprint_mb,
    rss_mb,
)

log = logging.getLogger("diffusers_worker")


def error(status: int, message: str, *, param: str | None = None,
          code: str = "invalid_request") -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": code}}, status_code=status)


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, max_length=32000)
    negative_prompt: str | None = None
    width: int = Field(default=512, ge=64, le=4096)
    height: int = Field(default=512, ge=64, le=4096)
    steps: int = Field(default=20, ge=1, le=200)
    guidance: float = Field(default=7.0, ge=0, le=50)
    seed: int | None = Field(default=None, ge=0)
    n: int = Field(default=1, ge=1, le=10)

    @field_validator("width", "height")
    @classmethod
    def _multiple_of_8(cls, value: int) -> int:
        if value % 8:
            raise ValueError("must be a multiple of 8")
        return value


class Worker:
    """The pipeline and everything known about it; one generation or move at a time."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.state = "loading"
        self.error: str | None = None
        self.pipe: Any = None
        self.device = "cpu"
        self.tier = "cpu"
        self.dtype = "float32"
        self.loads_from_disk = 0
        self.load_s: float | None = None
        self.footprint_mb: int | None = None
        self.notes: list[str] = []
        self.progress: dict[str, Any] = {"job": 0, "step": 0, "steps": 0, "state": "idle"}
        self.generating = False
        self.cancel_requested = False
        self.lock = threading.Lock()
        self.jobs = 0

    # -- loading --------------------------------------------------------------------------

    def load(self) -> None:
        import torch
        from diffusers import DiffusionPipeline

        args = self.args
        cuda = torch.cuda.is_available()
        self.device = "cuda" if args.device in ("auto", "cuda") and cuda else "cpu"
        if args.device == "cuda" and not cuda:
            self.notes.append("--device cuda asked but CUDA is not available; using the CPU")
        dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16,
                 "float32": torch.float32}.get(args.dtype)
        if dtype is None:  # auto
            dtype = torch.float16 if self.device == "cuda" else torch.float32
        self.dtype = str(dtype).replace("torch.", "")
        started = time.monotonic()
        kwargs: dict[str, Any] = {"torch_dtype": dtype, "local_files_only": True}
        offload = args.offload
        if offload == "balanced":
            if self.device == "cuda":
                kwargs["device_map"] = "balanced"
                if args.max_memory:
                    kwargs["max_memory"] = {int(k) if k.isdigit() else k: v
                                            for k, v in json.loads(args.max_memory).items()}
            else:
                self.notes.append("offload 'balanced' needs CUDA; running on the CPU")
        pipe = DiffusionPipeline.from_pretrained(args.model, **kwargs)
        self.loads_from_disk += 1
        pipe.set_progress_bar_config(disable=True)
        self.footprint_mb = pipeline_footprint_mb(pipe)
        if self.device == "cuda" and offload == "model":
            pipe.enable_model_cpu_offload()
        elif self.device == "cuda" and offload == "sequential":
            pipe.enable_sequential_cpu_offload()
        elif self.device == "cuda" and offload == "group":
            for name, component in pipe.components.items():
                if isinstance(component, torch.nn.Module) and hasattr(
                        component, "enable_group_offload"):
                    component.enable_group_offload(
                        onload_device=torch.device("cuda"), offload_device=torch.device("cpu"),
                        offload_type="block_level", num_blocks_per_group=1, use_stream=True)
                elif isinstance(component, torch.nn.Module):
                    from diffusers.hooks import apply_group_offloading

                    apply_group_offloading(component, onload_device=torch.device("cuda"),
                                           offload_type="leaf_level", use_stream=True)
                    self.notes.append(f"{name}: leaf-level group offload")
        elif offload == "balanced" and self.device == "cuda":
            pass  # placed by device_map
        else:
            if offload not in ("none", "balanced") and self.device != "cuda":
                self.notes.append(f"offload '{offload}' needs CUDA; running on the CPU")
            pipe.to(self.device)
        self.pipe = pipe
        self.tier = "gpu"
        self.load_s = round(time.monotonic() - started, 3)
        self.state = "ready"
        log.info("loaded %s in %.2fs on %s (%s), footprint %s MB", args.model, self.load_s,
                 self.device, self.dtype, self.footprint_mb)

    def load_in_background(self) -> None:
        def run() -> None:
            try:
                self.load()
            except Exception as exc:
                log.exception("loading %s failed", self.args.model)
                self.state = "failed"
                self.error = f"{type(exc).__name__}: {exc}"

        threading.Thread(target=run, name="load", daemon=True).start()

    # -- memory ---------------------------------------------------------------------------

    def memory(self) -> dict[str, Any]:
        report: dict[str, Any] = {"rss_mb": rss_mb()}
        if self.device == "cuda":
            import torch

            report.update(
                cuda_allocated_mb=int(torch.cuda.memory_allocated() // 2**20),
                cuda_reserved_mb=int(torch.cuda.memory_reserved() // 2**20),
                cuda_peak_mb=int(torch.cuda.max_memory_allocated() // 2**20))
            free, _total = torch.cuda.mem_get_info()
            report["cuda_free_mb"] = int(free // 2**20)
        return report

    def cuda_free_mb(self) -> int | None:
        if self.device != "cuda":
            return None
        import torch

        return int(torch.cuda.mem_get_info()[0] // 2**20)

    def offload(self) -> dict[str, Any]:
        with self.lock:
            started = time.monotonic()
            before = self.memory().get("cuda_allocated_mb")
            if self.tier != "cpu":
                self.pipe.to("cpu")
                self.tier = "cpu"
            gc.collect()
            if self.device == "cuda":
                import torch

                torch.cuda.empty_cache()
            after = self.memory().get("cuda_allocated_mb")
            freed = (before - after) if before is not None and after is not None \
                else self.footprint_mb
            return {"tier": "cpu", "freed_mb": freed,
                    "seconds": round(time.monotonic() - started, 4)}

    def onload(self) -> dict[str, Any]:
        with self.lock:
            started = time.monotonic()
            if self.tier != "gpu":
                self.pipe.to(self.device)
                self.tier = "gpu"
            return {"tier": "gpu", "device": self.device,
                    "seconds": round(time.monotonic() - started, 4)}

    # -- generation -----------------------------------------------------------------------

    def generate(self, req: GenerateRequest) -> dict[str, Any]:
        import torch

        queued = time.monotonic()
        with self.lock:
            if self.tier != "gpu":  # parked in RAM: come back first
                self.pipe.to(self.device)
                self.tier = "gpu"
            started = time.monotonic()
            self.jobs += 1
            self.generating = True
            self.cancel_requested = False
            self.progress = {"job": self.jobs, "step": 0, "steps": req.steps, "state": "running"}
            seed = req.seed if req.seed is not None else int.from_bytes(os.urandom(4), "big")
            generator = torch.Generator(device="cpu").manual_seed(seed)

            def on_step(pipe, step, _timestep, kwargs):
                self.progress["step"] = step + 1
                if self.cancel_requested:
                    pipe._interrupt = True
                return kwargs

            try:
                out = self.pipe(
                    prompt=req.prompt, negative_prompt=req.negative_prompt, width=req.width,
                    height=req.height, num_inference_steps=req.steps,
                    guidance_scale=req.guidance, num_images_per_prompt=req.n,
                    generator=generator, output_type="latent", callback_on_step_end=on_step)
                denoised = time.monotonic()
                if self.cancel_requested:
                    raise InterruptedError("generation cancelled")
                decision = decide_vae(req.width, req.height, self.args.vae_mb_per_512px,
                                      self.cuda_free_mb(), self.args.vram_margin_mb,
                                      self.args.allow_cpu_vae)
                images, decision = self.decode(out.images, req, decision)
                finished = time.monotonic()
            finally:
                self.generating = False
                self.progress["state"] = "idle"
        return {
            "images": [_png_b64(image) for image in images],
            "seed": seed, "device": self.device,
            "timings": {"queue_s": round(started - queued, 4),
                        "denoise_s": round(denoised - started, 4),
                        "decode_s": round(finished - denoised, 4),
                        "total_s": round(finished - queued, 4)},
            "memory_decisions": decision.to_dict(),
        }

    def decode(self, latents, req: GenerateRequest,
               decision: VaeDecision) -> tuple[list, VaeDecision]:
        import torch

        pipe, vae = self.pipe, self.pipe.vae
        if hasattr(pipe, "_unpack_latents"):  # FLUX packs its latents
            latents = pipe._unpack_latents(latents, req.height, req.width, pipe.vae_scale_factor)
        scaled = latents / vae.config.scaling_factor
        shift = getattr(vae.config, "shift_factor", None)
        if shift:
            scaled = scaled + shift

        def run(mode: str):
            if mode == "cpu":
                vae.to("cpu")
                try:
                    return vae.decode(scaled.to("cpu", vae.dtype), return_dict=False)[0]
                finally:
                    vae.to(self.device)
            if mode == "tiled":
                vae.enable_tiling()
                try:
                    return vae.decode(scaled.to(vae.device, vae.dtype), return_dict=False)[0]
                finally:
                    vae.disable_tiling()
            return vae.decode(scaled.to(vae.device, vae.dtype), return_dict=False)[0]

        with torch.no_grad():
            try:
                decoded = run(decision.mode)
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                decision = VaeDecision("tiled", decision.estimated_mb, decision.free_mb,
                                       "CUDA out of memory during decode; retried tiled")
                decoded = run("tiled")
        images = pipe.image_processor.postprocess(decoded.float(), output_type="pil")
        return images, decision

    def health(self) -> dict[str, Any]:
        return {"state": self.state, "error": self.error, "tier": self.tier,
                "device": self.device, "dtype": self.dtype, "offload": self.args.offload,
                "loads_from_disk": self.loads_from_disk, "load_s": self.load_s,
                "footprint_mb": self.footprint_mb, "memory": self.memory(),
                "generating": self.generating, "progress": self.progress, "notes": self.notes,
                "pid": os.getpid()}


def _png_b64(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def create_app(worker: Worker) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        worker.load_in_background()
        yield

    app = FastAPI(title="diffusers worker", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"] if p != "body") or None
        return error(400, f"{param}: {first['msg']}" if param else first["msg"], param=param)

    def not_ready() -> JSONResponse | None:
        if worker.state != "ready":
            return JSONResponse(worker.health(), status_code=503)
        return None

    @app.get("/health")
    async def health() -> JSONResponse:
        return not_ready() or JSONResponse(worker.health())

    @app.get("/progress")
    async def progress() -> dict[str, Any]:
        return worker.progress

    @app.post("/generate")
    async def generate(req: GenerateRequest) -> JSONResponse:
        if (busy := not_ready()) is not None:
            return error(503, f"pipeline is {worker.state}: {worker.error or ''}",
                         code="not_ready")
        del busy
        try:
            return JSONResponse(await asyncio.to_thread(worker.generate, req))
        except InterruptedError as exc:
            return error(409, str(exc), code="cancelled")
        except Exception as exc:
            log.exception("generation failed")
            return error(500, f"generation failed: {type(exc).__name__}: {exc}",
                         code="generation_failed")

    @app.post("/cancel")
    async def cancel() -> dict[str, Any]:
        worker.cancel_requested = worker.generating
        return {"cancelling": worker.cancel_requested}

    async def move(kind: str) -> JSONResponse:
        if worker.state != "ready":
            return error(503, f"pipeline is {worker.state}", code="not_ready")
        if worker.generating:
            return error(409, f"cannot {kind} while generating", code="busy")
        method = worker.offload if kind == "offload" else worker.onload
        return JSONResponse(await asyncio.to_thread(method))

    @app.post("/offload")
    async def offload() -> JSONResponse:
        return await move("offload")

    @app.post("/onload")
    async def onload() -> JSONResponse:
        return await move("onload")

    return app


def _die_with_parent(parent_pid: int | None) -> None:
    """Exit when the coordinator goes: PR_SET_PDEATHSIG, and a watch on its pid."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
        except OSError:
            pass
    if not parent_pid:
        return

    def watch() -> None:
        while True:
            time.sleep(2)
            try:
                os.kill(parent_pid, 0)
            except ProcessLookupError:
                os._exit(0)
            except PermissionError:
                pass

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="diffusers_worker")
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--dtype", choices=["auto", "float16", "bfloat16", "float32"],
                        default="auto")
    parser.add_argument("--offload", choices=["none", "model", "sequential", "group",
                                              "balanced"], default="none")
    parser.add_argument("--max-memory", default=None)
    parser.add_argument("--vae-mb-per-512px", type=float, default=1600.0)
    parser.add_argument("--allow-cpu-vae", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--vram-margin-mb", type=int, default=512)
    parser.add_argument("--parent-pid", type=int, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _die_with_parent(args.parent_pid)
    import uvicorn

    uvicorn.run(create_app(Worker(args)), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
