"""Playwright and Debian's chromium for the page tests; a module that needs them skips
cleanly where either is missing."""

from __future__ import annotations

import os
import shutil

import pytest


def playwright_and_chromium():
    """(``playwright.sync_api``, the chromium binary), or skip the calling test module."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright not installed: pip install -e '.[test]'")
    chromium = shutil.which("chromium") or (
        "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None)
    if chromium is None:
        pytest.skip("chromium not installed: apt-get install chromium", allow_module_level=True)
    return sync_api, chromium
