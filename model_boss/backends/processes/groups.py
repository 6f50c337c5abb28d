"""A worker's process group: who is in it, killing all of it, and the groups a previous
coordinator left behind (from their pid files).

A worker's group is every live process whose process group or session is the leader's pid
and that started no earlier than the leader (less a second of clock slack), so a pid number
reused since is left alone; our own process, group and session are never touched.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

CLOCK_SLACK_S = 1.0  # start times from /proc and from the pid file may differ this much


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _ours(pgid: int) -> bool:
    return pgid <= 1 or pgid in (os.getpid(), os.getpgrp(), os.getsid(0))


def _scan_group(pgid: int, since: float) -> tuple[list[psutil.Process], bool]:
    """Live processes in group or session ``pgid`` started at or after ``since`` (less the
    slack), and whether that group also holds an older process (a reused number)."""
    members: list[psutil.Process] = []
    older = False
    own = os.getpid()
    for pid in psutil.pids():
        if pid == own:
            continue
        try:
            if pgid not in (os.getpgid(pid), os.getsid(pid)):
                continue
            proc = psutil.Process(pid)
            if proc.create_time() < since - CLOCK_SLACK_S:
                older = True
            elif proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (OSError, psutil.Error):  # gone while we looked
            continue
    return members, older


def group_members(pgid: int, since: float) -> list[int]:
    """Pids of the live processes of the worker group ``pgid`` whose leader started at
    ``since`` (its process group or session, not older than the leader)."""
    if _ours(pgid):
        return []
    return [proc.pid for proc in _scan_group(pgid, since)[0]]


def kill_group(pgid: int, since: float) -> list[int]:
    """SIGKILL every live process of the worker group ``pgid`` (see :func:`group_members`),
    whether or not its leader is still there; returns their pids."""
    if _ours(pgid):
        return []
    killed: list[int] = []
    for _ in range(5):  # again while new ones turn up: a fork may race the scan
        members, older = _scan_group(pgid, since)
        fresh = [proc for proc in members if proc.pid not in killed]
        if not fresh:
            break
        if not older:  # killpg also reaches a child forked after the scan
            signal_group(pgid, signal.SIGKILL)
        for proc in fresh:
            with contextlib.suppress(psutil.Error):
                proc.kill()
            killed.append(proc.pid)
    return killed


def _reused(pgid: int, since: float) -> bool:
    """Whether a process other than the recorded leader now holds the leader's pid."""
    try:
        return abs(psutil.Process(pgid).create_time() - since) >= CLOCK_SLACK_S
    except psutil.Error:
        return False  # the leader is gone; its group may still have members


def reap_orphans(pid_dir: Path) -> list[int]:
    """Kill the process groups of workers a previous coordinator left behind (from their pid
    files), leader or no leader; return the pids killed."""
    reaped: list[int] = []
    if not pid_dir.is_dir():
        return reaped
    for path in pid_dir.glob("*.json"):
        try:
            record = json.loads(path.read_text())
            pgid = int(record.get("pgid", record["pid"]))
            since = float(record["create_time"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring unreadable pid file %s: %s", path, exc)
        else:
            pids = [] if _reused(pgid, since) else kill_group(pgid, since)
            if pids:
                reaped.extend(pids)
                log.warning("reaped orphan worker %s (process group %d, pids %s) from a "
                            "previous run", record.get("name"), pgid, pids)
        with contextlib.suppress(OSError):
            path.unlink()
    return reaped
