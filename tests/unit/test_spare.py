"""SpareWorkers' own rules, on real (tiny) processes: a spare that cannot come up is retried,
and after three young deaths in a row spares of that kind stay off; nothing is handed out
that is not ready; a manifest with its own environment never takes a spare."""

from __future__ import annotations

import asyncio
import sys

from model_boss.backends import spare as spare_module
from model_boss.backends.diffusers import DiffusersBackend
from model_boss.backends.spare import DIFFUSERS, SpareWorkers
from model_boss.catalog import Catalog, load_manifests
from model_boss.events import EventBus
from model_boss.settings import Settings


def settings(tmp_path) -> Settings:
    return Settings(manifests=[], tasks_file=None, state_dir=tmp_path / "state",
                    health_timeout_s=10, stop_grace_s=1)


async def test_a_spare_that_keeps_dying_young_turns_spares_off(tmp_path, monkeypatch):
    monkeypatch.setattr(spare_module, "spare_argv",
                        lambda kind, port: [sys.executable, "-c", "import sys; sys.exit(3)"])
    events = EventBus()
    disabled = asyncio.Event()
    events.listen(lambda event: event["type"] == "spare_disabled" and disabled.set())
    spares = SpareWorkers(settings(tmp_path), events)
    spares.replenish(DIFFUSERS)
    await asyncio.wait_for(disabled.wait(), 30)
    assert len(events.recent("spare_disabled")) == 1
    assert spares.take(DIFFUSERS) is None and spares.status() == []
    spares.replenish(DIFFUSERS)  # off now: nothing is started again
    assert spares.status() == []
    await spares.shutdown()
    assert not events.recent("spare_ready")


async def test_nothing_is_taken_before_a_spare_is_ready(tmp_path, monkeypatch):
    monkeypatch.setattr(spare_module, "spare_argv",
                        lambda kind, port: [sys.executable, "-c", "import time; time.sleep(30)"])
    spares = SpareWorkers(settings(tmp_path), EventBus())
    spares.replenish(DIFFUSERS)
    async with asyncio.timeout(10):
        while not any(s["pid"] for s in spares.status()):  # noqa: ASYNC110 (no event for it)
            await asyncio.sleep(0.05)
    [starting] = spares.status()
    assert starting["ready"] is False
    assert spares.take(DIFFUSERS) is None  # started, but it has not answered as a spare
    await spares.shutdown()
    assert spares.status() == []


async def test_a_manifest_with_its_own_env_never_takes_a_spare(tmp_path):
    (tmp_path / "pipe").mkdir()
    taken: list[str] = []

    class Spares:
        def take(self, kind):
            taken.append(kind)
            return None

        def replenish(self, kind):
            pass

    manifest_file = tmp_path / "m.yaml"
    manifest_file.write_text(
        f"- {{id: env-sd, category: diffusion, backend: diffusers, path: {tmp_path / 'pipe'}, "
        f"env: {{HF_HOME: /x}}}}\n"
        f"- {{id: plain-sd, category: diffusion, backend: diffusers, path: {tmp_path / 'pipe'}}}\n")
    entries = Catalog(load_manifests([manifest_file]), tmp_path)
    for model in ("env-sd", "plain-sd"):
        backend = DiffusersBackend(entries.get(model), settings(tmp_path))
        backend.spares = Spares()  # type: ignore[assignment]
        backend.argv = lambda port, placement: [sys.executable, "-c", "raise SystemExit(1)"]
        try:
            await backend.start(1, None)
        except Exception:  # the stand-in worker exits at once: only who asked for a spare counts
            pass
    assert taken == [DIFFUSERS]  # plain-sd asked; env-sd went straight to a new process


async def test_torch_workers_threads_spin_briefly_unless_the_user_says(tmp_path, monkeypatch):
    """Cold starts and spares alike get ``GOMP_SPINCOUNT`` (a third of GNU OpenMP's spin: idle
    torch threads would spin 10 ms on the cores the coordinator serves from, and not at all
    would slow each forward); a wait policy or a spin count in a manifest's env or in the
    coordinator's own environment wins."""
    from model_boss.backends.transformers import TransformersBackend

    (tmp_path / "emb").mkdir()
    manifest_file = tmp_path / "m.yaml"
    manifest_file.write_text(
        f"- {{id: plain, category: embedding, backend: transformers, path: {tmp_path / 'emb'}}}\n"
        f"- {{id: passive, category: embedding, backend: transformers, "
        f"path: {tmp_path / 'emb'}, env: {{OMP_WAIT_POLICY: PASSIVE}}}}\n"
        f"- {{id: spins, category: embedding, backend: transformers, path: {tmp_path / 'emb'}, "
        f"env: {{GOMP_SPINCOUNT: '5'}}}}\n"
        f"- {{id: sd, category: diffusion, backend: diffusers, path: {tmp_path / 'emb'}}}\n")
    entries = Catalog(load_manifests([manifest_file]), tmp_path)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)

    def threads(model: str, kind: type) -> tuple[str | None, str | None]:
        env = kind(entries.get(model), settings(tmp_path)).environment(None)
        return env.get("OMP_WAIT_POLICY"), env.get("GOMP_SPINCOUNT")

    spin = str(spare_module.OMP_SPIN_TURNS)
    assert {model: threads(model, kind) for model, kind in
            (("plain", TransformersBackend), ("passive", TransformersBackend),
             ("spins", TransformersBackend), ("sd", DiffusersBackend))} == {
        "plain": (None, spin), "passive": ("PASSIVE", None), "spins": (None, "5"),
        "sd": (None, spin)}
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert threads("plain", TransformersBackend) == ("ACTIVE", None)
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("GOMP_SPINCOUNT", "0")
    assert threads("plain", TransformersBackend) == (None, "0")
    monkeypatch.delenv("GOMP_SPINCOUNT")

    started: list[dict[str, str]] = []

    class Recorded(spare_module.WorkerProcess):
        def __init__(self, *args, env=None, **kwargs):
            started.append(dict(env or {}))
            super().__init__(*args, env=env, **kwargs)

    monkeypatch.setattr(spare_module, "WorkerProcess", Recorded)
    monkeypatch.setattr(spare_module, "spare_argv",
                        lambda kind, port: [sys.executable, "-c", "import sys; sys.exit(3)"])
    spares = SpareWorkers(settings(tmp_path), EventBus())
    spares.replenish(DIFFUSERS)
    async with asyncio.timeout(10):
        while not started:  # noqa: ASYNC110 (no event for it)
            await asyncio.sleep(0.05)
    await spares.shutdown()
    assert started[0]["GOMP_SPINCOUNT"] == spin
    assert "OMP_WAIT_POLICY" not in started[0]
