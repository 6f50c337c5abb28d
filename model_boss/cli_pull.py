"""``model-boss pull SOURCE``: the daemon pulls, this draws its progress (one bar per file)."""

from __future__ import annotations

import json
import sys

import httpx


def pull(url: str, headers: dict[str, str], source: str, timeout: float) -> int:
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}
    last: dict = {}
    try:
        with httpx.stream("POST", url + "/api/v1/models/pull", headers=headers,
                          json={"source": source}, timeout=timeout) as response:
            if response.status_code >= 400:
                response.read()
                print(f"model-boss: {_message(response.text)}", file=sys.stderr)
                return 1
            for line in response.iter_lines():
                if not line.strip():
                    continue
                last = json.loads(line)
                _draw(bars, last)
    except httpx.HTTPError as exc:
        print(f"model-boss: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    finally:
        for bar in bars.values():
            bar.close()
    if last.get("status") != "success":
        error = last.get("error") or {}
        print(f"model-boss: pull failed: {error.get('message', last)}", file=sys.stderr)
        return 1
    print(f"pulled {source}: serving it as '{last['model']}' ({last['path']})")
    return 0


def _draw(bars: dict, report: dict) -> None:
    from tqdm import tqdm

    if report.get("status") != "downloading":
        return
    file = report["file"]
    bar = bars.get(file)
    if bar is None:
        bar = bars[file] = tqdm(total=report["total"], unit="B", unit_scale=True,
                                unit_divisor=1024, desc=file.rsplit("/", 1)[-1][:40])
    bar.update(report["completed"] - bar.n)


def _message(text: str) -> str:
    try:
        return json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return text
