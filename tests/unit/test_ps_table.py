"""``model-boss ps``'s tables (cli/ps.py): every model in the catalog with its state, loaded
or not; one SIZE, the estimate and, once loaded, the measured figure, each labelled; and why
FREE is less than CAPACITY - LEASED."""

from __future__ import annotations

from typing import Any

from model_boss.cli.ps import render_ps

NOW = 1_700_000_000.0


def _status(**gpu: Any) -> dict[str, Any]:
    """A status document: three catalog models, one of them loaded, one whose file is gone."""
    lease = {"id": "lease-a", "holder": "model-boss@box:1", "kind": "inference",
             "allocations": {"0": 305}, "expires_at": NOW + 20, "note": "loaded-a"}
    return {
        "time": NOW,
        "gpus": [{"index": 0, "name": "declared-8g", "capacity_mb": 8192, "leased_mb": 305,
                  "free_mb": 7375, "nvml_free_mb": None, "source": "declared",
                  "reserve_mb": 512, **gpu}],
        "slots": [{"model": "loaded-a", "state": "ready", "tier": "gpu", "pid": 42,
                   "active_requests": 1, "pinned": False, "unload_at": NOW + 240,
                   "vram_estimate": {"mb": 305, "rung": "llama.cpp-fit"}, "measured_mb": 195,
                   "lease": lease,
                   "processor": {"size_mb": 305, "label": "100% GPU (declared)"}}],
        "models": [
            {"id": "loaded-a", "available": True, "vram_estimate": None},
            {"id": "cold-b", "available": True,
             "vram_estimate": {"mb": 1500, "rung": "file"}},
            {"id": "gone-c", "available": False, "unavailable_reason": "file missing: c.gguf",
             "vram_estimate": {"mb": 700, "rung": "manifest"}},
        ],
        "leases": [lease], "queue": {"depth": 0}}


def _models(text: str) -> dict[str, list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("MODEL "))
    header = lines[start]
    columns = [header.index(name) for name in ("MODEL", "STATE", "SIZE", "FROM", "PROCESSOR",
                                               "UNTIL", "PID")]
    rows = {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        cells = [line[a:b].strip() for a, b in zip(columns, [*columns[1:], None], strict=True)]
        rows[cells[0]] = cells[1:]
    return rows


def test_every_catalog_model_is_listed_with_its_state_loaded_first():
    text = render_ps(_status(), NOW)
    rows = _models(text)
    assert list(rows) == ["loaded-a", "cold-b", "gone-c"]
    assert [row[0] for row in rows.values()] == ["ready", "idle", "unavailable"]
    assert rows["cold-b"][3:5] == ["-", "-"]  # not running: no processor, no deadline
    assert "unavailable: gone-c: file missing: c.gguf" in text


def test_one_size_column_the_estimate_and_the_measured_figure_labelled():
    text = render_ps(_status(), NOW)
    header = next(line for line in text.splitlines() if line.startswith("MODEL "))
    assert header.split().count("SIZE") == 1 and "VRAM MB" not in header
    rows = _models(text)
    assert rows["loaded-a"][1:3] == ["305 MB est., 195 MB measured", "llama.cpp-fit"]
    assert rows["cold-b"][1:3] == ["1.5 GB est.", "file"]
    assert rows["gone-c"][1:3] == ["700 MB est.", "manifest"]


def test_ps_says_what_free_leaves_out():
    text = render_ps(_status(), NOW)
    assert "GPU 0: FREE = CAPACITY - LEASED - 512 MB reserve (vram_margin_mb" in text
    # the driver sees less free than the leases leave: the rest is used outside model-boss
    text = render_ps(_status(free_mb=6000, nvml_free_mb=6512), NOW)
    assert "512 MB reserve" in text and "1375 MB used outside model-boss's leases" in text
    # no note where FREE is all of CAPACITY - LEASED (no reserve)
    text = render_ps(_status(free_mb=7887, reserve_mb=0), NOW)
    assert "FREE =" not in text


def test_adapters_show_on_their_bases_worker():
    status = _status()
    status["slots"][0]["adapters"] = ["sql", "poet"]
    status["models"] += [{"id": "sql", "base": "loaded-a", "available": True},
                         {"id": "poet", "base": "loaded-a", "available": True}]
    text = render_ps(status, NOW)
    rows = _models(text)
    assert rows["sql"][0] == rows["poet"][0] == "ready"  # as their base's worker is
    assert rows["sql"][5].split()[0] == rows["loaded-a"][5].split()[0] == "42"  # one process
    assert "adapters on their base's worker: loaded-a (sql, poet)" in text


def test_open_realtime_sessions_are_listed_and_the_models_they_hold_stay_while_open():
    status = _status()
    status["slots"][0]["held_by"] = ["sess_1"]
    status["realtime_sessions"] = [
        {"id": "sess_1", "model": "talk", "key": "alice", "end_user": "", "priority": 3,
         "opened_at": NOW - 125, "turns": 4, "responding": False,
         "models": ["whisper", "loaded-a", "voice"]}]
    text = render_ps(status, NOW)
    assert _models(text)["loaded-a"][4] == "While 1 session"
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("REALTIME SESSION"))
    assert lines[header + 1].split() == ["sess_1", "talk", "alice", "3", "4", "2m05s",
                                         "whisper,", "loaded-a,", "voice"]
    assert lines[-1].endswith("realtime sessions: 1")
    assert "REALTIME SESSION" not in render_ps(_status(), NOW)
