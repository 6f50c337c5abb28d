"""Jobs on Redis Streams: any member takes any job; none is lost, none completes twice.

Each model has a stream (``<prefix>:cluster:jobs:<model>``; jobs naming a task or no model
go to ``…:jobs:_any``) read by the consumer group ``members``, one consumer per host id.
The job itself stays where :class:`~model_boss.jobs.RedisJobStore` keeps it
(``<prefix>:job:<id>``), so any member answers ``GET /api/v1/jobs/<id>``.

- **Warm first.** A member reads the streams of the models it has READY first; the streams
  of models READY on another member are left to that member (until its record says
  otherwise or lapses), the rest are read by whoever comes first.
- **A member that dies mid-job.** While a member runs a job it keeps the stream entry fresh
  (XCLAIM to itself, each heartbeat); an entry left idle for ``cluster_job_claim_s`` is taken
  by another member (XAUTOCLAIM) and run again.
- **Exactly-once completion.** Every write of a job goes through one Lua script that refuses
  to change a finished job; the finishing write also acknowledges the entry. A second run of
  the same job (the first member was slow, not dead) finds it finished and leaves it be.
- **A member that stops** (SIGTERM) puts its running jobs back on their streams at once.
- **Cancel** marks the job cancelled wherever it runs and sends a notice; the member running
  it stops it (were the notice lost, that run's outcome is refused: the job is finished).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as redis

from ..errors import StoreUnavailable
from ..jobs import FINISHED, Job, JobManager, JobStatus, JobStore, Runner

log = logging.getLogger(__name__)

GROUP = "members"
ANY = "_any"

# KEYS[1] job key, KEYS[2] jobs index; ARGV: job JSON, ttl s (0: none), created_at, max jobs,
# and for a finishing write: stream key, entry id (ACKed whether or not this write wins).
# Returns 1 when written, 0 when the job was already finished (nothing written).
PUT_UNLESS_FINISHED = """
local raw = redis.call('GET', KEYS[1])
local written = 1
if raw then
  local status = cjson.decode(raw).status
  if status == 'succeeded' or status == 'failed' or status == 'cancelled' then written = 0 end
end
if written == 1 then
  if tonumber(ARGV[2]) > 0 then
    redis.call('SET', KEYS[1], ARGV[1], 'EX', math.ceil(tonumber(ARGV[2])))
  else
    redis.call('SET', KEYS[1], ARGV[1])
  end
  redis.call('ZADD', KEYS[2], ARGV[3], cjson.decode(ARGV[1]).id)
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -tonumber(ARGV[4]) - 1)
end
if ARGV[5] and ARGV[5] ~= '' then redis.call('XACK', ARGV[5], 'members', ARGV[6]) end
return written
"""


@dataclass(slots=True)
class Taken:
    """A stream entry this member is working on."""

    stream: str
    entry: str


class JobStreams:
    """The Redis side: streams, the consumer group, and the guarded job writes."""

    def __init__(self, url: str, host_id: str, prefix: str = "model-boss",
                 max_jobs: int = 1000) -> None:
        self.host_id = host_id
        self.prefix = prefix
        self.max_jobs = max_jobs
        self._redis = redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)
        self._put = self._redis.register_script(PUT_UNLESS_FINISHED)
        self._groups: set[str] = set()

    def stream(self, model: str) -> str:
        return f"{self.prefix}:cluster:jobs:{model}"

    async def _group(self, stream: str) -> None:
        if stream in self._groups:
            return
        try:
            await self._redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._groups.add(stream)

    async def write(self, job: Job, ttl_s: float | None, taken: Taken | None = None) -> bool:
        """Write ``job`` unless it is finished already; ``taken``: also ACK its entry."""
        try:
            return bool(await self._put(
                keys=[f"{self.prefix}:job:{job.id}", f"{self.prefix}:jobs"],
                args=[orjson.dumps(job.public(with_body=True)), ttl_s or 0, job.created_at,
                      self.max_jobs, taken.stream if taken else "",
                      taken.entry if taken else ""]))
        except redis.RedisError as exc:
            raise StoreUnavailable(f"job store: Redis unreachable: {exc}") from exc

    async def add(self, model: str, job_id: str) -> None:
        stream = self.stream(model)
        try:
            await self._group(stream)
            await self._redis.xadd(stream, {"job": job_id})
        except redis.RedisError as exc:
            raise StoreUnavailable(f"job queue: Redis unreachable: {exc}") from exc

    async def take(self, models: list[str], block_ms: int | None) -> list[tuple[Taken, str]]:
        """New entries from the streams of ``models`` (at most one each)."""
        if not models:
            return []
        streams = [self.stream(m) for m in models]
        for stream in streams:
            await self._group(stream)
        try:
            answer = await self._redis.xreadgroup(GROUP, self.host_id,
                                                  {s: ">" for s in streams}, count=1,
                                                  block=block_ms)
        except redis.ResponseError as exc:
            if "NOGROUP" in str(exc):  # Redis restarted empty: make the groups again
                self._groups.clear()
                return []
            raise
        return [(Taken(_text(stream), _text(entry)), _text(fields[b"job"]))
                for stream, entries in answer or [] for entry, fields in entries]

    async def reclaim(self, models: list[str], idle_s: float) -> list[tuple[Taken, str]]:
        """Entries another member took and left idle for ``idle_s`` (it died)."""
        found = []
        for model in models:
            stream = self.stream(model)
            try:
                answer = await self._redis.xautoclaim(
                    stream, GROUP, self.host_id, int(idle_s * 1000), "0-0", count=10)
            except redis.ResponseError:  # no stream or group yet
                continue
            # [next id, entries(, deleted ids)]; an entry whose message was trimmed has none
            found += [(Taken(stream, _text(entry)), _text(fields[b"job"]))
                      for entry, fields in answer[1] if fields]
        return found

    async def keep(self, taken: list[Taken]) -> None:
        """Reset the idle time of entries this member is still working on."""
        for t in taken:
            await self._redis.xclaim(t.stream, GROUP, self.host_id, 0, [t.entry],
                                     justid=True)

    async def give_back(self, taken: Taken, job_id: str) -> None:
        """Put a job this member will not finish back on its stream, for another member."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xack(taken.stream, GROUP, taken.entry)
            pipe.xadd(taken.stream, {"job": job_id})
            await pipe.execute()

    async def ack(self, taken: Taken) -> None:
        await self._redis.xack(taken.stream, GROUP, taken.entry)

    async def close(self) -> None:
        await self._redis.aclose()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class StreamJobManager(JobManager):
    """A :class:`JobManager` whose jobs wait on Redis Streams for any member to take them."""

    def __init__(self, store: JobStore, runner: Runner, streams: JobStreams, *,
                 model_of: Callable[[Job], str], models: Callable[[], list[str]],
                 warm_here: Callable[[], set[str]], warm_elsewhere: Callable[[], set[str]],
                 claim_s: float, keep_s: float,
                 announce_cancel: Callable[[str], Awaitable[None]] | None = None,
                 result_ttl_s: float = 3600, max_active: int = 1000) -> None:
        super().__init__(store, runner, result_ttl_s=result_ttl_s, max_active=max_active)
        self.streams = streams
        self.model_of = model_of
        self.models = models
        self.warm_here = warm_here
        self.warm_elsewhere = warm_elsewhere
        self.claim_s = claim_s
        self.keep_s = keep_s
        self.announce_cancel = announce_cancel
        self._taken: dict[str, Taken] = {}
        self._stopping = False
        self._loop: asyncio.Task | None = None

    async def submit(self, endpoint: str, body: dict[str, Any], client_id: str, *,
                     trace: dict[str, str] | None = None) -> Job:
        job = Job(id="job-" + uuid.uuid4().hex[:20], endpoint=endpoint, body=body,
                  client_id=client_id, trace=trace or {})
        await self.streams.write(job, None)
        await self.streams.add(self.model_of(job), job.id)
        return job

    async def update(self, job: Job, **changes: Any) -> None:
        if self._stopping and changes.get("status") == JobStatus.CANCELLED:
            return  # stopping, not cancelled: the job goes back on its stream
        for key, value in changes.items():
            setattr(job, key, value)
        finished = job.status in FINISHED
        taken = self._taken.get(job.id) if finished else None
        if not await self.streams.write(job, self.result_ttl_s if finished else None, taken):
            log.info("job %s was finished elsewhere; this run's outcome is dropped", job.id)

    async def cancel(self, job_id: str) -> Job:
        job = await self.get(job_id)
        if job.id in self._tasks:
            return await super().cancel(job_id)
        if job.status not in FINISHED:  # queued, or running on another member
            job.status, job.finished_at = JobStatus.CANCELLED, time.time()
            await self.streams.write(job, self.result_ttl_s)
            if self.announce_cancel is not None:  # the member running it stops it
                await self.announce_cancel(job_id)
        return await self.get(job_id)

    async def requeue(self, job_id: str) -> Job | None:
        """A clustered job does not yield: its stream entry is this member's until it ends,
        and a run started over here would not be seen by the others. It runs on."""
        return None

    async def cancelled_elsewhere(self, job_id: str) -> None:
        """Another member cancelled a job this member runs: stop it."""
        task = self._tasks.get(job_id)
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # -- taking work --------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.create_task(self._take_loop(), name="cluster-jobs")

    async def _take_loop(self) -> None:
        kept_at = 0.0
        while not self._stopping:  # the flag too: a cancel can be lost mid-command (runner.py)
            try:
                now = time.monotonic()
                if now - kept_at >= self.keep_s:
                    kept_at = now
                    await self.streams.keep(list(self._taken.values()))
                    await self._start_all(await self.streams.reclaim(self._readable(True),
                                                                     self.claim_s))
                if len(self._tasks) >= self.max_active:
                    await asyncio.sleep(self.keep_s)
                    continue
                warm = sorted(self.warm_here())
                found = await self.streams.take(warm, None) if warm else []
                if not found:
                    found = await self.streams.take(self._readable(False),
                                                    int(self.keep_s * 1000))
                await self._start_all(found)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the loop never dies; Redis may be restarting
                log.warning("cluster jobs: %s", exc)
                await asyncio.sleep(self.keep_s)

    def _readable(self, everything: bool) -> list[str]:
        """The streams to read: all of them, or those not left to a warm member."""
        models = self.models()
        if not everything:
            elsewhere = self.warm_elsewhere() - self.warm_here()
            models = [m for m in models if m not in elsewhere]
        return models

    async def _start_all(self, found: list[tuple[Taken, str]]) -> None:
        for taken, job_id in found:
            job = await self.store.get(job_id)
            if job_id in self._tasks:  # our own entry, idle too long: still ours
                self._taken[job_id] = taken
                continue
            if job is None or job.status in FINISHED:
                await self.streams.ack(taken)  # expired, cancelled, or done already
                continue
            if self._left_to_another(job):  # read on a list made before it warmed there
                await self.streams.give_back(taken, job_id)
                continue
            self._taken[job_id] = taken
            await self.update(job, status=JobStatus.QUEUED, member=self.streams.host_id)
            task = asyncio.create_task(self._run(job), name=job.id)
            self._tasks[job.id] = task
            task.add_done_callback(lambda _t, jid=job.id: self._done(jid))

    def _left_to_another(self, job: Job) -> bool:
        """Whether ``job``'s model is READY on another member and not here: that member
        takes it (a blocking read names its streams before it waits, so a model that warmed
        elsewhere meanwhile can still be read here)."""
        model = self.model_of(job)
        return model in self.warm_elsewhere() and model not in self.warm_here()

    def _done(self, job_id: str) -> None:
        self._tasks.pop(job_id, None)
        if not self._stopping:
            self._taken.pop(job_id, None)

    async def shutdown(self) -> None:
        """Stop taking; put running jobs back on their streams for the other members."""
        self._stopping = True
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(BaseException):
                await self._loop
        for task in list(self._tasks.values()):
            task.cancel()
        for task in list(self._tasks.values()):
            with contextlib.suppress(BaseException):
                await task
        for job_id, taken in list(self._taken.items()):
            with contextlib.suppress(Exception):
                await self.streams.give_back(taken, job_id)
        self._taken.clear()
        await self.streams.close()
        await self.store.close()

