"""A recording proxy for the coding-agent tests: it forwards every request to a coordinator
(streams included) and keeps each request's method, path, JSON body, status and whole answer,
so a test can read what Claude Code or Codex sent and check what they got.

It forwards each body unchanged but for its ``pins``: (pattern, replacement) pairs applied to
the body's bytes, with which a test fixes what an agent writes of the day and the machine into
its prompt (tests/e2e/test_agents.py says which and why); each exchange counts the pins that
matched.

    python -m tests.e2e.agent_recorder --upstream http://127.0.0.1:8210 --port 8299 \
        --out requests.jsonl

In a test: ``with Recorder(upstream) as recorder: ... recorder.url ... recorder.exchanges``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

# hop-by-hop headers, and those the proxy's own framing sets again
DROPPED = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


@dataclass
class Exchange:
    """One request as it arrived, and the status it was answered with."""

    method: str
    path: str
    body: Any  # the parsed JSON body, or None
    status: int = 0
    answer: bytes = b""  # the answer, whole
    pinned: int = 0  # how many pins matched in the body


@dataclass
class Recorder:
    """The proxy, on its own event loop in a thread, on a free port of 127.0.0.1."""

    upstream: str
    out: Path | None = None
    pins: tuple[tuple[re.Pattern[bytes], bytes], ...] = ()
    exchanges: list[Exchange] = field(default_factory=list)
    url: str = ""
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None

    def __enter__(self) -> Recorder:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._start())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="agent-recorder", daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the recording proxy did not start")
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._loop is not None and self._thread is not None
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    def bodies(self, path: str) -> list[Any]:
        """The JSON bodies sent to ``path``, in order."""
        return [exchange.body for exchange in self.on(path)]

    def on(self, path: str) -> list[Exchange]:
        """The exchanges on ``path``, in order."""
        return [exchange for exchange in list(self.exchanges) if exchange.path == path]

    async def _start(self, port: int = 0) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._session = aiohttp.ClientSession(auto_decompress=False,
                                              timeout=aiohttp.ClientTimeout(total=None))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{bound}"

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        pinned = 0
        for pattern, replacement in self.pins:
            raw, count = pattern.subn(replacement, raw)
            pinned += count
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        exchange = Exchange(request.method, request.path, body, pinned=pinned)
        self.exchanges.append(exchange)
        self._log({"method": exchange.method, "path": exchange.path, "body": body})
        headers = {k: v for k, v in request.headers.items() if k.lower() not in DROPPED}
        async with self._session.request(request.method, self.upstream + request.path_qs,
                                         headers=headers, data=raw or None) as answer:
            exchange.status = answer.status
            response = web.StreamResponse(status=answer.status, headers={
                k: v for k, v in answer.headers.items() if k.lower() not in DROPPED})
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                exchange.answer += chunk
                await response.write(chunk)
            await response.write_eof()
        self._log({"method": exchange.method, "path": exchange.path, "status": answer.status,
                   "answer": exchange.answer.decode(errors="replace")})
        return response

    def _log(self, record: dict[str, Any]) -> None:
        # a line as the request arrives (its body) and one as its answer ends (its status)
        if self.out is not None:
            with self.out.open("a") as log:
                log.write(json.dumps(record) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="one JSON line per request")
    args = parser.parse_args()
    recorder = Recorder(args.upstream.rstrip("/"), out=args.out)

    async def run() -> None:
        await recorder._start(args.port)
        print(f"recording {recorder.url} -> {recorder.upstream} into {args.out}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


if __name__ == "__main__":
    main()
