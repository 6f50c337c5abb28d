"""What this install can run: the Python extra (``pyproject.toml``'s optional dependencies) each
worker kind needs, the modules its worker imports that tell whether it is there, and the words
that name what is missing and the one command that installs it.

Decided once, at discovery, over an injectable ``importable``: the Python workers run on the
coordinator's own interpreter (``sys.executable``, same environment), so a module this process
cannot find, their import cannot either. A model whose extra is missing is listed unavailable
and never loaded; a worker that fails anyway (a manifest's ``env`` changing its path) names the
extra through :func:`install_hint`."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .manifest import BackendKind, Category, LlamaWorker, ModelManifest

if TYPE_CHECKING:
    from ..settings import Settings

Importable = Callable[[str], bool]  # a top-level module's name -> whether an import finds it

SETUP = "bash scripts/setup.sh"
BASE_EXTRA = "llama"  # what scripts/setup.sh installs by default (the README's set-up)
_NO_MODULE = re.compile(r"No module named '([\w.]+)'")


@dataclass(frozen=True, slots=True)
class Requirement:
    """The extra a kind of model needs, and the modules its worker imports from it."""

    extra: str
    modules: tuple[str, ...]

    @property
    def command(self) -> str:
        """The one command that adds the extra to a checkout's .venv (setup.sh keeps the
        extras installed before: the base one is named only so the line reads whole)."""
        extras = self.extra if self.extra == BASE_EXTRA else f"{BASE_EXTRA},{self.extra}"
        return f"{SETUP} {extras}"


DIFFUSION = Requirement("diffusion", ("torch", "diffusers", "transformers"))
# a video pipeline's clip is encoded by PyAV (workers/diffusers/media/mp4.py)
DIFFUSION_VIDEO = Requirement("diffusion", ("torch", "diffusers", "transformers", "av"))
SENTENCE_TRANSFORMERS = Requirement("transformers",
                                    ("torch", "transformers", "sentence_transformers"))
# speech: transformers' pipelines, audio decoded and encoded by PyAV (workers/transformers)
SPEECH = Requirement("transformers", ("torch", "transformers", "av"))
# VibeVoice: transformers' generate builds its default noise scheduler from diffusers
# (DPMSolverMultistepScheduler), and nothing else ships one
VOICE_CLONING = Requirement("transformers", ("torch", "transformers", "av", "diffusers"))
# a transformers model's layers streamed from CPU RAM: diffusers' group offloading hooks
# (workers/transformers/layers.py)
LAYER_OFFLOAD = ("diffusers",)
# a realtime pipeline: the coordinator hears turns end with silero-vad (services/realtime)
REALTIME = Requirement("realtime", ("torch", "silero_vad"))
LLAMA_NATIVE = Requirement("llama", ("xllamacpp",))
LLAMA_CPP_PYTHON = Requirement("llama-cpp-python", ("llama_cpp",))


# every kind of model, as ``model-boss doctor`` lists them, with what each needs installed
KINDS: tuple[tuple[str, Requirement | None], ...] = (
    ("GGUF models on llama.cpp's own server (built in)", LLAMA_NATIVE),
    ("GGUF models on llama-cpp-python (worker: llama-cpp-python)", LLAMA_CPP_PYTHON),
    ("diffusers picture pipelines", DIFFUSION),
    ("diffusers video pipelines", DIFFUSION_VIDEO),
    ("embedders and rerankers (sentence-transformers)", SENTENCE_TRANSFORMERS),
    ("speech recognition and voices (transformers)", SPEECH),
    ("voices in reference recordings (VibeVoice)", VOICE_CLONING),
    ("realtime pipelines' turn detection (silero-vad)", REALTIME),
    ("cloud remotes, commands, an external llama-server", None),
)


@dataclass(frozen=True, slots=True)
class KindReadiness:
    """Whether this install runs one kind of model: the modules of its extra it lacks."""

    kind: str
    needed: Requirement | None
    missing: tuple[str, ...]

    @property
    def ready(self) -> bool:
        return not self.missing


def readiness(importable: Importable) -> list[KindReadiness]:
    """Every kind of model and whether this install can run it (``KINDS``, in order)."""
    return [KindReadiness(kind, needed, tuple(
        module for module in (needed.modules if needed else ()) if not importable(module)))
        for kind, needed in KINDS]


def default_llama_worker(settings: Settings) -> LlamaWorker:
    """How a llama model whose manifest names no ``worker`` is run: the settings' default,
    else binary when a ``llama_server_binary`` is configured, else native."""
    if settings.llama_worker is not None:
        return LlamaWorker(settings.llama_worker)
    return LlamaWorker.BINARY if settings.llama_server_binary else LlamaWorker.NATIVE


def requirement(manifest: ModelManifest,
                llama_default: LlamaWorker = LlamaWorker.NATIVE) -> Requirement | None:
    """What a model of this kind needs installed; None: nothing beyond model-boss itself (an
    external llama-server, a command, a cloud remote)."""
    if manifest.category == Category.REALTIME:
        return REALTIME
    if manifest.backend == BackendKind.DIFFUSERS:
        return DIFFUSION_VIDEO if manifest.category == Category.VIDEO else DIFFUSION
    if manifest.backend == BackendKind.TRANSFORMERS:
        from .voices import clones_voices  # numpy: only where a transformers model is

        if clones_voices(manifest.path):
            return VOICE_CLONING
        needed = SPEECH if manifest.category in (Category.STT, Category.TTS) \
            else SENTENCE_TRANSFORMERS
        counted = isinstance(manifest.gpu_layers, int) and manifest.gpu_layers >= 0
        if manifest.allow_partial or counted:  # some layers may stream
            needed = Requirement(needed.extra, (*needed.modules, *LAYER_OFFLOAD))
        return needed
    if manifest.backend == BackendKind.LLAMA_SERVER:
        worker = manifest.worker or llama_default
        return {LlamaWorker.NATIVE: LLAMA_NATIVE,
                LlamaWorker.LLAMA_CPP_PYTHON: LLAMA_CPP_PYTHON}.get(worker)
    return None


def not_installed(needed: Requirement | None, importable: Importable) -> str | None:
    """Why a model that needs ``needed`` cannot run on this install (its modules missing,
    named, with the command that installs them); None when it can."""
    if needed is None:
        return None
    missing = [module for module in needed.modules if not importable(module)]
    if not missing:
        return None
    names = ", ".join(f"'{module}'" for module in missing)
    return (f"this install lacks the '{needed.extra}' extra (no module named {names}): "
            f"install it with `{needed.command}`, then `model-boss reload`")


def install_hint(needed: Requirement | None, error: str) -> str | None:
    """For a worker's error line: the extra to install when it says a module of ``needed`` is
    missing (``No module named 'torch'``); None for any other error."""
    found = _NO_MODULE.search(error)
    if needed is None or found is None or found.group(1).split(".")[0] not in needed.modules:
        return None
    return f"the '{needed.extra}' extra is not installed: install it with `{needed.command}`"


def module_found(name: str) -> bool:
    """Whether an import of top-level module ``name`` would find it, without importing it
    (torch's import alone takes seconds)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken package, or a stand-in without a spec
        return False
