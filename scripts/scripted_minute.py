"""A scripted minute of traffic, to see the dashboard's timeline tell it: three models that take
turns on one declared GPU that holds one of them, a training job's lease for the middle third,
and two clients at different priorities (an app at priority 1 asking the writer every few
seconds, a batch client at priority 8 going through the summariser and the coder).

    .venv/bin/python scripts/scripted_minute.py [--seconds 60] [--out docs]

Starts its own coordinator on a free port (the demo model under three names, one timeline
point a second), drives it, then takes light and dark screenshots of ``/ui`` after it
(Debian's chromium through Playwright) and stops it. ``--url`` drives a coordinator already
running with the same three models instead (and takes no screenshots unless ``--out``).
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("writer", "summariser", "coder")
GPU = {"index": 0, "name": "sim-4g", "vram_mb": 4096}  # 3,584 MB usable: one model at a time
MODEL_MB = 3000
LEASE_MB = 500
CLIENTS = {"app": 1, "batch": 8}  # client id → priority (0 is the most important)
APP_EVERY_S = 6.0


def manifests(gguf: Path) -> list[dict]:
    """The demo model under three names; the writer stays warm 3 s after its last request,
    so the batch client's models get their turns between the app's requests."""
    return [{"id": model, "category": "llm", "backend": "llama-server", "path": str(gguf),
             "ctx_size": 512, "threads": 1, "vram_mb": MODEL_MB,
             **({"stay_warm_s": 3} if model == "writer" else {})} for model in MODELS]


def settings(port: int, workdir: Path, manifest_dir: Path) -> dict:
    return {"host": "127.0.0.1", "port": port, "manifests": [str(manifest_dir)],
            "tasks_file": None, "discover": False, "models_dir": str(workdir / "models"),
            "state_dir": str(workdir / "state"), "use_nvml": False, "gpus": [GPU],
            "history_step_s": 1, "spare_workers": False, "reclaim_sleep_s": 0}


def _chat(client: httpx.Client, model: str, who: str, words: str) -> int:
    body = {"model": model, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": words}]}
    try:
        answer = client.post("/v1/chat/completions", json=body, timeout=120,
                             headers={"x-client-id": who, "x-priority": str(CLIENTS[who])})
        return answer.status_code
    except httpx.HTTPError:
        return 0


def drive(url: str, seconds: float, headers: dict[str, str] | None = None,
          until_all_loaded: bool = False) -> dict:
    """Run the script against ``url``; answers ``{"sent": {client: n}, "ok": {client: n},
    "lease": id}`` (an answer that is not a 200 counts as sent, not ok). With
    ``until_all_loaded``, it goes on past ``seconds`` (up to three times as long) until each
    of the three models has loaded at least once, as on a slow machine it may not have."""
    sent: Counter[str] = Counter()
    ok: Counter[str] = Counter()
    lock = threading.Lock()
    started = time.monotonic()
    stop = threading.Event()

    def note(who: str, status: int) -> None:
        with lock:
            sent[who] += 1
            ok[who] += status == 200

    def app() -> None:
        with httpx.Client(base_url=url, headers=headers) as client:
            while not stop.is_set():
                note("app", _chat(client, "writer", "app", "Write one line about rivers."))
                stop.wait(APP_EVERY_S)

    def batch(worker: int) -> None:
        with httpx.Client(base_url=url, headers=headers) as client:
            turn = 0
            while not stop.is_set():
                model = ("summariser", "coder")[turn % 2]
                for _ in range(2):
                    note("batch", _chat(client, model, "batch", f"Summarise item {worker}."))
                turn += 1

    threads = [threading.Thread(target=app)] + [
        threading.Thread(target=batch, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    lease = None
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        time.sleep(seconds / 3)
        taken = client.post("/api/v1/leases", json={
            "vram_mb": LEASE_MB, "holder": "trainer", "kind": "training", "ttl_s": seconds,
            "note": "fine-tune run"})
        if taken.status_code == 201:
            lease = taken.json()["id"]
            time.sleep(max(0.0, started + 2 * seconds / 3 - time.monotonic()))
            client.delete(f"/api/v1/leases/{lease}")
        time.sleep(max(0.0, started + seconds - time.monotonic()))
        while until_all_loaded and time.monotonic() < started + 3 * seconds:
            slots = client.get("/api/v1/status").json()["slots"]
            if {s["model"] for s in slots if s["loads"]} >= set(MODELS):
                break
            time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join()
    return {"sent": dict(sent), "ok": dict(ok), "lease": lease}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(workdir: Path, gguf: Path) -> tuple[subprocess.Popen, str]:
    manifest_dir = workdir / "manifests"
    manifest_dir.mkdir(parents=True)
    (manifest_dir / "models.yaml").write_text(yaml.safe_dump(manifests(gguf)))
    port = _free_port()
    config = workdir / "model-boss.yaml"
    config.write_text(yaml.safe_dump(settings(port, workdir, manifest_dir)))
    log = (workdir / "server.log").open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "model_boss", "serve", "--config",
                             str(config)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.terminate()
    raise SystemExit(f"the coordinator did not start; see {workdir / 'server.log'}")


def _screenshots(url: str, out: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        for scheme in ("light", "dark"):
            page = browser.new_page(viewport={"width": 1280, "height": 1000},
                                    color_scheme=scheme)
            page.goto(url + "/ui/")
            expect(page.locator(".marks-list li").first).to_be_visible(timeout=15_000)
            expect(page.locator("#client-waits tbody tr").first).to_be_visible()
            page.wait_for_timeout(500)
            for section in ("timeline", "requests"):
                target = out / f"dashboard-{section}-{scheme}.png"
                page.locator(f"#{section}").screenshot(path=str(target))
                print(f"{target} ({target.stat().st_size // 1024} KiB)")
            page.close()
        browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--url", help="drive this coordinator instead of starting one")
    parser.add_argument("--out", type=Path, help="where the screenshots go (default: docs/ "
                        "when this script starts the coordinator)")
    args = parser.parse_args()
    if args.url:
        print(drive(args.url.rstrip("/"), args.seconds))
        if args.out:
            _screenshots(args.url.rstrip("/"), args.out)
        return 0
    sys.path.insert(0, str(ROOT))
    from tests.conftest import DEMO_GGUF, MODELS_DIR

    if not DEMO_GGUF.exists():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_demo_model.py"),
                        str(MODELS_DIR)], check=True)
    with tempfile.TemporaryDirectory(prefix="scripted-minute-") as tmp:
        proc, url = _start(Path(tmp), DEMO_GGUF)
        try:
            print(drive(url, args.seconds))
            time.sleep(2)  # one more timeline point after the last request
            _screenshots(url, args.out or ROOT / "docs")
        finally:
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
