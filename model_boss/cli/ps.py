"""``model-boss ps``: the status document as tables, GPUs, their leases, then models (``--watch``
redraws them on every event, ``--cluster`` draws the cluster's); ``model-boss status``: that
document as JSON. The tables are pure formatting (:func:`render_ps`: status dict and a clock
in, text out), so what ``ps`` claims is tested without a daemon."""

from __future__ import annotations

import argparse
import time
from typing import Any

from .client import TABLE_TIMEOUT_S, DaemonClient
from .command import Subparsers, add_command, print_json


def add_parser(sub: Subparsers) -> None:
    parser = add_command(sub, "ps", run, summary="GPUs, their leases, and every model of a "
                         "running daemon and its state", examples=("model-boss ps --watch",))
    parser.add_argument("--cluster", action="store_true",
                        help="every member of its cluster and their models")
    parser.add_argument("--watch", action="store_true",
                        help="redraw on every event; loads show their stage")
    add_command(sub, "status", status, summary="the full status document as JSON",
                examples=("model-boss status > status.json",))


def run(args: argparse.Namespace, client: DaemonClient) -> int:
    if args.watch:
        from .watch import watch

        return watch(args, client, draw)
    draw(args, client)
    return 0


def draw(args: argparse.Namespace, client: DaemonClient) -> None:
    """The tables once: this daemon's (from its status document), or its cluster's."""
    if args.cluster:
        from .cluster import format_cluster

        print(client.readable(format_cluster,
                              client.get("/api/v1/cluster", timeout=TABLE_TIMEOUT_S)))
        return
    document = client.get("/api/v1/status", timeout=TABLE_TIMEOUT_S)
    # the server's clock: countdowns (UNTIL, lease expiry) read right from another host
    print(client.readable(lambda status: render_ps(status, status.get("time", time.time())),
                          document))


def status(args: argparse.Namespace, client: DaemonClient) -> int:
    return print_json(client.get("/api/v1/status"))


def human_size(mb: int | float | None) -> str:
    """MB as ``ollama ps`` writes sizes: "98 MB", "1.5 GB"."""
    if not mb:
        return "-"
    return f"{mb / 1024:.1f} GB" if mb >= 1024 else f"{round(mb)} MB"


def _in(seconds: float) -> str:
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= 2 * size:
            return f"{int(seconds // size)} {unit}s from now"
        if seconds >= size:
            return f"about a{'n' * (unit == 'hour')} {unit} from now"
    return f"{max(1, int(seconds))} seconds from now"


def until(slot: dict[str, Any], now: float) -> str:
    """When the model leaves memory if nothing uses it: "Forever" (pinned or kept until
    evicted), "While 1 session" (open realtime sessions hold it), "4 minutes from now",
    "Stopping..." once due; "-" when not loaded."""
    if slot.get("tier", "disk") == "disk":
        return "-"
    if slot.get("pinned"):
        return "Forever (pinned)"
    if slot.get("held_by"):
        count = len(slot["held_by"])
        return f"While {count} session{'s' * (count > 1)}"  # open; its end starts the clock
    deadline = slot.get("unload_at")
    if deadline is None:
        return "Forever"
    if deadline <= now:
        return "in use" if slot.get("active_requests") else "Stopping..."
    return _in(deadline - now)


def processor(slot: dict[str, Any]) -> str:
    split = slot.get("processor")
    if split:
        return split["label"]
    placement = slot.get("placement") or {}  # a daemon that predates the split
    return placement.get("share", "-") if slot.get("tier") == "gpu" else "-"


def lease_rows(status: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per lease and GPU it holds: who (``model-boss`` and the model for a slot's
    lease, else the holder and its note), kind, GPU, MB, expiry and id; by GPU, slots first."""
    by_slot = {s["lease"]["id"]: s["model"] for s in status["slots"] if s.get("lease")}
    rows = []
    for lease in status["leases"]:
        model = by_slot.get(lease["id"])
        for gpu, mb in lease["allocations"].items():
            rows.append({"holder": "model-boss" if model else lease["holder"],
                         "kind": lease["kind"],
                         "for": model or lease.get("note") or "outside holder",
                         "gpu": int(gpu), "mb": mb, "expires_at": lease["expires_at"],
                         "id": lease["id"], "slot": model is not None})
    return sorted(rows, key=lambda r: (r["gpu"], not r["slot"], r["for"], r["id"]))


def expires(expires_at: float, now: float) -> str:
    """A lease's time left: "28 seconds from now"; "expired" once past (not yet reclaimed)."""
    return _in(expires_at - now) if expires_at > now else "expired"


def size(model: dict[str, Any], slot: dict[str, Any] | None) -> str:
    """The one SIZE of a model: its VRAM estimate, and what was measured while it was
    loaded, each labelled ("305 MB est., 195 MB measured"); "-" for one that needs none."""
    slot = slot or {}
    estimate = (slot.get("vram_estimate") or model.get("vram_estimate") or {}).get("mb")
    text = f"{human_size(estimate)} est." if estimate else "-"
    if slot.get("measured_mb") and slot.get("tier", "disk") != "disk":
        text += f", {human_size(slot['measured_mb'])} measured"
    return text


def model_rows(status: dict[str, Any]) -> list[dict[str, Any]]:
    """Every catalog model (``status["models"]``), with its slot where it has one; a slot
    whose model left the catalog still shows while it runs. Loaded first, then by name."""
    slots = {s.get("key", s["model"]): s for s in status.get("slots", [])}  # replicas: id#n
    models = {m["id"]: m for m in status.get("models", [])}
    rows = []
    for name in {*models, *slots}:
        model = models.get(name, {"id": name})
        slot = slots.get(model.get("base") or name)  # an adapter runs on its base's worker
        state = slot["state"] if slot else "idle"
        if not model.get("available", True) and state == "idle":
            state = "unavailable"
        rows.append({"model": name, "slot": slot, "info": model, "state": state})
    return sorted(rows, key=lambda r: (r["state"] in ("idle", "unavailable"), r["model"]))


def gpu_notes(status: dict[str, Any], leased: dict[int, int]) -> list[str]:
    """Why FREE is less than CAPACITY - LEASED, per GPU where it is: the reserve kept back
    (``vram_margin_mb``), and what the driver says others use."""
    notes = []
    for g in status["gpus"]:
        held = leased.get(g["index"], 0)
        short = g["capacity_mb"] - held - g["free_mb"]
        if short <= 0:
            continue
        reserve = g.get("reserve_mb")
        parts = [f"{reserve} MB reserve (vram_margin_mb, kept free on every GPU)"] \
            if reserve else []
        outside = short - (reserve or 0)
        if g.get("nvml_free_mb") is not None and outside > 0:
            parts.append(f"{outside} MB used outside model-boss's leases (the driver says "
                         f"{g['nvml_free_mb']} MB free)")
        elif outside > 0 and reserve is not None:
            parts.append(f"{outside} MB held by leases not listed here")
        notes.append(f"GPU {g['index']}: FREE = CAPACITY - LEASED - "
                     + (" - ".join(parts) if parts else f"{short} MB the daemon keeps back"))
    return notes


def render_ps(status: dict[str, Any], now: float) -> str:
    """GPUs (with where the inventory comes from, and what FREE leaves out), every lease on
    them, and every model in the catalog. LEASED is the sum of the leases listed under it,
    so the figures add up; SIZE is the model's VRAM estimate (and what was measured once it
    ran), FROM where the estimate comes from (measured, manifest, llama.cpp-fit, file, ...),
    PROCESSOR where it runs, UNTIL its keep-alive deadline."""
    leases = lease_rows(status)
    leased: dict[int, int] = {}
    for row in leases:
        leased[row["gpu"]] = leased.get(row["gpu"], 0) + row["mb"]
    lines = [f"{'GPU':<5}{'NAME':<22}{'SOURCE':<10}{'CAPACITY':>10}{'LEASED':>10}{'FREE':>10}"]
    for g in status["gpus"]:
        lines.append(f"{g['index']:<5}{g['name'][:21]:<22}{g.get('source', '-'):<10}"
                     f"{g['capacity_mb']:>10}{leased.get(g['index'], 0):>10}{g['free_mb']:>10}")
    notes = gpu_notes(status, leased)
    if notes:
        lines += ["", *notes]
    lines.append("")
    lines.append(f"{'LEASE HOLDER':<24}{'KIND':<11}{'FOR':<24}{'GPU':>4}{'MB':>8}  "
                 f"{'EXPIRES':<26}{'ID'}")
    for r in leases:
        lines.append(f"{r['holder'][:23]:<24}{r['kind'][:10]:<11}{r['for'][:23]:<24}"
                     f"{r['gpu']:>4}{r['mb']:>8}  {expires(r['expires_at'], now)[:25]:<26}"
                     f"{r['id']}")
    if not leases:
        lines.append("(no leases)")
    lines.append("")
    lines.append(f"{'MODEL':<24}{'STATE':<12}{'SIZE':<29}{'FROM':<15}{'PROCESSOR':<27}"
                 f"{'UNTIL':<20}{'PID':>8}{'ACTIVE':>7}")
    rows = model_rows(status)
    for row in rows:
        s = row["slot"] or {}
        est = s.get("vram_estimate") or row["info"].get("vram_estimate") or {}
        lines.append(f"{row['model'][:23]:<24}{row['state'][:11]:<12}"
                     f"{size(row['info'], row['slot'])[:28]:<29}{est.get('rung', '-')[:14]:<15}"
                     f"{processor(s)[:26]:<27}{until(s, now)[:19]:<20}"
                     f"{s.get('pid') or '-':>8}{s.get('active_requests', 0):>7}")
    if not rows:
        lines.append("(no models: put a GGUF in the models folder, or model-boss pull one)")
    why = [f"{r['model']}: {r['info'].get('unavailable_reason')}" for r in rows
           if r["state"] == "unavailable" and r["info"].get("unavailable_reason")]
    kept = [f"{s['model']} {s['prompt_cache']['files']} saved "
            f"({human_size(s['prompt_cache']['mb'])}, restored {s['prompt_cache']['restores']}x)"
            for s in status["slots"] if (s.get("prompt_cache") or {}).get("files")]
    lowered = [f"{r['model']} {r['info']['ctx_size']} ({r['info']['ctx_note']})" for r in rows
               if r["info"].get("ctx_note")]
    lines.append("")
    if why:
        lines.append("unavailable: " + "; ".join(why))
    if lowered:
        lines.append("contexts lowered to fit: " + "; ".join(lowered))
    if kept:
        lines.append("prompt caches: " + "; ".join(kept))
    on_base = [f"{s['model']} ({', '.join(s['adapters'])})" for s in status["slots"]
               if s.get("adapters")]
    if on_base:
        lines.append("adapters on their base's worker: " + "; ".join(on_base))
    sessions = status.get("realtime_sessions") or []
    if sessions:
        lines += ["", f"{'REALTIME SESSION':<30}{'PIPELINE':<16}{'KEY':<16}{'PRIORITY':>9}"
                      f"{'TURNS':>7}  {'OPEN FOR':<12}{'MODELS'}"]
        for session in sessions:
            lines.append(f"{session['id'][:29]:<30}{session['model'][:15]:<16}"
                         f"{(session.get('key') or '-')[:15]:<16}{session['priority']:>9}"
                         f"{session['turns']:>7}  {_took(now - session['opened_at']):<12}"
                         f"{', '.join(session['models'])}")
    lines.append(f"queue depth: {status['queue']['depth']}   leases: {len(status['leases'])}"
                 f"   realtime sessions: {len(sessions)}")
    return "\n".join(lines)


def _took(seconds: float) -> str:
    """A duration as ``1h02m``, ``3m05s`` or ``12s``."""
    seconds = max(0, int(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
