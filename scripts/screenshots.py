"""Light and dark screenshots of a running coordinator's dashboard, for docs/ and README.md.

    .venv/bin/python scripts/screenshots.py [--url http://127.0.0.1:8210] [--out docs]

Uses Debian's chromium (``apt-get install chromium``) through Playwright; no browser download.
With admin keys configured, pass the key in MODEL_BOSS_ADMIN_KEY.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("MODEL_BOSS_URL", "http://127.0.0.1:8210"))
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=800)
    args = parser.parse_args()
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not os.access(chromium, os.X_OK):
        print("chromium not installed: apt-get install chromium", file=sys.stderr)
        return 1
    key = os.environ.get("MODEL_BOSS_ADMIN_KEY", "")
    args.out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        for scheme in ("light", "dark"):
            context = browser.new_context(
                viewport={"width": args.width, "height": args.height}, color_scheme=scheme)
            if key:
                context.add_init_script(
                    f"sessionStorage.setItem('model-boss-admin-key', {key!r})")
            page = context.new_page()
            page.goto(args.url.rstrip("/") + "/ui/")
            expect(page.locator("#live")).to_have_text("live")
            expect(page.locator("article.model").first).to_be_visible()
            page.wait_for_timeout(500)  # let the first burst of events settle into one render
            target = args.out / f"dashboard-{scheme}.png"
            page.screenshot(path=str(target))
            print(f"{target} ({target.stat().st_size // 1024} KiB)")
            context.close()
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
