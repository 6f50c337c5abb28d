"""A small real TTS-shaped worker for the ``command`` backend: ``/v1/audio/speech`` returns
a WAV whose length follows the input text. Flags make it start slowly or crash on demand."""

from __future__ import annotations

import argparse
import io
import math
import struct
import sys
import time
import wave

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def tone(seconds: float, rate: int = 16000) -> bytes:
    frames = b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate)))
                      for i in range(int(seconds * rate)))
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(frames)
    return buffer.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--start-delay", type=float, default=0.0)
    parser.add_argument("--exit-on-start", action="store_true")
    parser.add_argument("--ignore-sigterm", action="store_true")
    args = parser.parse_args()
    if args.ignore_sigterm:
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.exit_on_start:
        print("tiny_tts: refusing to start (--exit-on-start)", flush=True)
        sys.exit(3)
    time.sleep(args.start_delay)

    async def health(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def speech(request: Request) -> Response:
        body = await request.json()
        return Response(tone(0.05 * len(body["input"])), media_type="audio/wav")

    import uvicorn

    app = Starlette(routes=[Route("/health", health), Route("/v1/audio/speech", speech,
                                                            methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=args.port,
                                           log_level="warning"))
    if args.ignore_sigterm:  # keep uvicorn from installing its own SIGTERM handler
        import contextlib

        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    server.run()


if __name__ == "__main__":
    main()
