"""``model-boss pull SOURCE``: the daemon pulls, this draws its progress: where it asks, each
retry while the hub does not answer (and why), one bar per file; a failure in one line that
says why and, when the hub cannot be reached, how to use a mirror."""

from __future__ import annotations

import json
import sys
from typing import Any

import httpx

from ..errors import error_text, network_reason


def pull(url: str, headers: dict[str, str], source: str, timeout: float) -> int:
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}
    last: dict[str, Any] = {}
    try:
        with httpx.stream("POST", url + "/api/v1/models/pull", headers=headers,
                          json={"source": source}, timeout=timeout) as response:
            if response.status_code >= 400:
                print(f"model-boss: {error_text(response.read(), response.status_code)}",
                      file=sys.stderr)
                return 1
            for line in response.iter_lines():
                if not line.strip():
                    continue
                last = json.loads(line)
                if not isinstance(last, dict):
                    raise ValueError(f"a progress line that is not an object: {line[:80]}")
                _draw(bars, last)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        print(f"model-boss: cannot reach {url}: {network_reason(exc)}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"model-boss: {url} sent progress this command cannot read ({exc})",
              file=sys.stderr)
        return 1
    finally:
        for bar in bars.values():
            bar.close()
    if last.get("status") != "success":
        error = last.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        print(f"model-boss: pull failed: {message or last or 'the daemon ended the answer'}",
              file=sys.stderr)
        return 1
    print(f"pulled {source}: serving it as '{last.get('model')}' ({last.get('path')})")
    return 0


def _draw(bars: dict, report: dict[str, Any]) -> None:
    """A progress line: a bar per file downloading; the rest as one line on stderr."""
    from tqdm import tqdm

    status = report.get("status")
    line = progress_line(report)
    if line:
        (tqdm.write if bars else print)(line, file=sys.stderr)
    if status != "downloading":
        return
    file = report["file"]
    bar = bars.get(file)
    if bar is None:
        bar = bars[file] = tqdm(total=report["total"], unit="B", unit_scale=True,
                                unit_divisor=1024, desc=file.rsplit("/", 1)[-1][:40])
    bar.update(report["completed"] - bar.n)


def progress_line(report: dict[str, Any]) -> str | None:
    """What a report says in words, or None for one a bar draws (or nothing to say)."""
    status = report.get("status")
    if status == "resolving":
        return f"asking {report.get('endpoint') or 'the hub'} for {report.get('source')} ..."
    if status == "retrying":
        what = f" ({report['file']})" if report.get("file") else ""
        return (f"no answer{what}: {report.get('reason') or 'unknown'}; retry "
                f"{report.get('attempt')} of {report.get('of')} in {report.get('wait_s', 0):g}s")
    if status == "verifying":
        return f"verifying {report.get('file')}"
    if status == "placed":
        return f"placed {report.get('file')}"
    return None
