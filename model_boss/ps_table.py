"""``model-boss ps``: the status document as tables, GPUs, their leases, then models. Pure
formatting (status dict and a clock in, text out), so what ``ps`` claims is tested without a
daemon."""

from __future__ import annotations

from typing import Any


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
    evicted), "4 minutes from now", "Stopping..." once due; "-" when not loaded."""
    if slot.get("tier", "disk") == "disk":
        return "-"
    if slot.get("pinned"):
        return "Forever (pinned)"
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


def render_ps(status: dict[str, Any], now: float) -> str:
    """GPUs (with where the inventory comes from), every lease on them, and every model's
    slot. LEASED is the sum of the leases listed under it, so the figures add up; SIZE is the
    whole model, PROCESSOR where it runs, UNTIL its keep-alive deadline; VRAM MB and FROM are
    the estimate and its rung (measured, manifest, llama.cpp-fit, file, ...)."""
    leases = lease_rows(status)
    leased: dict[int, int] = {}
    for row in leases:
        leased[row["gpu"]] = leased.get(row["gpu"], 0) + row["mb"]
    lines = [f"{'GPU':<5}{'NAME':<22}{'SOURCE':<10}{'CAPACITY':>10}{'LEASED':>10}{'FREE':>10}"]
    for g in status["gpus"]:
        lines.append(f"{g['index']:<5}{g['name'][:21]:<22}{g.get('source', '-'):<10}"
                     f"{g['capacity_mb']:>10}{leased.get(g['index'], 0):>10}{g['free_mb']:>10}")
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
    lines.append(f"{'MODEL':<24}{'STATE':<11}{'SIZE':>9}  {'PROCESSOR':<27}{'UNTIL':<20}"
                 f"{'VRAM MB':>8} {'FROM':<14}{'PID':>8}{'ACTIVE':>7}")
    for s in status["slots"]:
        est = s.get("vram_estimate") or {}
        size = (s.get("processor") or {}).get("size_mb") or est.get("mb")
        lines.append(f"{s['model'][:23]:<24}{s['state']:<11}{human_size(size):>9}  "
                     f"{processor(s)[:26]:<27}{until(s, now)[:19]:<20}"
                     f"{est.get('mb', '-'):>8} {est.get('rung', '-'):<14}"
                     f"{s.get('pid') or '-':>8}{s.get('active_requests', 0):>7}")
    kept = [f"{s['model']} {s['prompt_cache']['files']} saved "
            f"({human_size(s['prompt_cache']['mb'])}, restored {s['prompt_cache']['restores']}x)"
            for s in status["slots"] if (s.get("prompt_cache") or {}).get("files")]
    lines.append("")
    if kept:
        lines.append("prompt caches: " + "; ".join(kept))
    lines.append(f"queue depth: {status['queue']['depth']}   leases: {len(status['leases'])}")
    return "\n".join(lines)
