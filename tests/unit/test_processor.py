"""``ps`` tells the truth: the processor split (gpu/processor.py) and the ``model-boss ps``
table (cli/ps.py), from tables of slots."""

from __future__ import annotations

import pytest

from model_boss.cli.ps import human_size, render_ps, until
from model_boss.gpu.processor import processor_split

BASE = {"tier": "gpu", "size_mb": 1000, "leased_mb": 1000, "gpu_layers": -1,
        "total_layers": 30, "declared": False}


@pytest.mark.parametrize("change, label, vram, percent", [
    ({}, "100% GPU", 1000, 100),
    ({"gpu_layers": None}, "100% GPU", 1000, 100),  # a worker without layers (diffusers)
    ({"gpu_layers": 30}, "100% GPU", 1000, 100),
    ({"gpu_layers": 40}, "100% GPU", 1000, 100),  # llama.cpp clamps to what the model has
    ({"declared": True}, "100% GPU (declared)", 1000, 100),
    ({"gpu_layers": 15, "leased_mb": 520}, "50%/50% CPU/GPU", 520, 50),
    ({"gpu_layers": 29, "leased_mb": 980}, "3%/97% CPU/GPU", 980, 97),
    ({"gpu_layers": 1, "total_layers": 200, "leased_mb": 10}, "99%/1% CPU/GPU", 10, 1),
    ({"gpu_layers": 299, "total_layers": 300}, "1%/99% CPU/GPU", 1000, 99),  # never 100%
    ({"gpu_layers": 12, "leased_mb": 400, "declared": True}, "60%/40% CPU/GPU (declared)",
     400, 40),
    ({"gpu_layers": 0}, "100% CPU", 0, 0),
    ({"leased_mb": 0}, "100% CPU", 0, 0),
    ({"tier": "cpu", "leased_mb": 0}, "100% CPU", 0, 0),  # parked in CPU RAM
    ({"tier": "cpu", "leased_mb": 0, "declared": True}, "100% CPU", 0, 0),
    ({"tier": "disk", "leased_mb": 0}, "-", 0, 0),
])
def test_processor_split(change, label, vram, percent):
    split = processor_split(**{**BASE, **change})
    assert (split.label, split.vram_mb, split.gpu_percent) == (label, vram, percent)
    assert split.size_mb >= split.vram_mb


def test_remote_models_run_nowhere_here():
    split = processor_split(**BASE, remote=True)
    assert (split.label, split.size_mb, split.vram_mb) == ("remote", 0, 0)


def test_size_is_never_below_what_is_leased():
    assert processor_split(**{**BASE, "size_mb": 10}).size_mb == 1000


@pytest.mark.parametrize("mb, text", [(None, "-"), (0, "-"), (98, "98 MB"), (1023, "1023 MB"),
                                      (1536, "1.5 GB"), (24576, "24.0 GB")])
def test_human_size(mb, text):
    assert human_size(mb) == text


NOW = 1_000_000.0


@pytest.mark.parametrize("slot, text", [
    ({"tier": "disk"}, "-"),
    ({"tier": "gpu", "pinned": True, "unload_at": None}, "Forever (pinned)"),
    ({"tier": "gpu", "unload_at": None}, "Forever"),
    ({"tier": "cpu", "unload_at": None}, "Forever"),
    ({"tier": "gpu", "unload_at": NOW + 30}, "30 seconds from now"),
    ({"tier": "gpu", "unload_at": NOW + 90}, "about a minute from now"),
    ({"tier": "gpu", "unload_at": NOW + 299}, "4 minutes from now"),
    ({"tier": "gpu", "unload_at": NOW + 3600}, "about an hour from now"),
    ({"tier": "gpu", "unload_at": NOW + 3 * 86400}, "3 days from now"),
    ({"tier": "gpu", "unload_at": NOW - 1}, "Stopping..."),
    ({"tier": "gpu", "unload_at": NOW - 1, "active_requests": 2}, "in use"),
])
def test_until(slot, text):
    assert until(slot, NOW) == text


def _slot(model, state, tier, processor=None, **extra):
    return {"model": model, "state": state, "tier": tier, "pid": 42 if tier != "disk" else None,
            "active_requests": 0, "pinned": False, "unload_at": NOW + 240,
            "vram_estimate": {"mb": 300, "rung": "measured"}, "processor": processor, **extra}


def test_render_ps_shows_each_slot_as_it_is():
    status = {
        "gpus": [{"index": 0, "name": "sim-8g", "capacity_mb": 8192, "leased_mb": 820,
                  "free_mb": 6860, "source": "declared"}],
        "slots": [
            _slot("full", "ready", "gpu", processor_split(**{**BASE, "declared": True})
                  .to_dict()),
            _slot("half", "ready", "gpu", processor_split(
                **{**BASE, "gpu_layers": 15, "leased_mb": 520}).to_dict()),
            _slot("parked", "offloaded", "cpu", processor_split(
                **{**BASE, "tier": "cpu", "leased_mb": 0}).to_dict(), pinned=True),
            _slot("cold", "idle", "disk", processor_split(
                **{**BASE, "tier": "disk", "leased_mb": 0}).to_dict(),
                  prompt_cache={"files": 1, "mb": 62.3, "restores": 2}),
        ],
        "queue": {"depth": 2},
        "leases": [{"id": f"lease-{m}", "holder": "model-boss@box:1", "kind": "inference",
                    "allocations": {"0": mb}, "expires_at": NOW + 20} for m, mb in
                   (("full", 300), ("half", 520))]}
    text = render_ps(status, NOW)
    rows = {line.split()[0]: line for line in text.splitlines() if line}
    assert "declared" in rows["0"]
    assert "100% GPU (declared)" in rows["full"] and "4 minutes from now" in rows["full"]
    assert "300 MB est." in rows["full"]  # one SIZE: the estimate (measured once it ran)
    assert "50%/50% CPU/GPU" in rows["half"] and "100% GPU" not in rows["half"]
    assert "100% CPU" in rows["parked"] and "Forever (pinned)" in rows["parked"]
    assert "GPU" not in rows["cold"].split("idle")[1]
    assert "queue depth: 2   leases: 2" in text
    assert "prompt caches: cold 1 saved (62 MB, restored 2x)" in text  # only where kept
    header = next(line for line in text.splitlines() if line.startswith("MODEL"))
    assert all(col in header for col in ("SIZE", "PROCESSOR", "UNTIL"))


def test_render_ps_of_a_daemon_without_the_split_falls_back_to_the_placement():
    slot = _slot("old", "ready", "gpu", None, placement={"share": "48%/52% CPU/GPU"})
    text = render_ps({"gpus": [], "slots": [slot], "queue": {"depth": 0}, "leases": []}, NOW)
    assert "48%/52% CPU/GPU" in text
