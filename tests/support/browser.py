"""Debian's Chromium for the console's browser tests (``tests/browser/``), and where their screenshots go.

Playwright never downloads a browser here: it launches the binary at ``OPENCLAW_CHROMIUM`` (default
``/usr/bin/chromium``, Debian's ``chromium`` package, which ``./dev test`` installs as root when it is missing).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from tests.support.processes import ROOT

CHROMIUM = Path(os.environ.get("OPENCLAW_CHROMIUM", "/usr/bin/chromium"))
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
AXE_REPORTS = ROOT / "test-artifacts" / "axe"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def chromium_missing_reason() -> str | None:
    if os.access(CHROMIUM, os.X_OK):
        return None
    return (
        f"{CHROMIUM} not found: install Debian's chromium (./dev test does, as root with apt-get) "
        "or set OPENCLAW_CHROMIUM"
    )


def chromium_launch_args() -> dict[str, Any]:
    # Chromium's sandbox refuses to start as root; as any other user it stays on.
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    return {"executable_path": str(CHROMIUM), "headless": True, "args": args}


class Screenshots:
    """Numbered screenshots of one test's pages, each at the desktop and the phone size."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.count = 0

    @classmethod
    def for_test(cls, test_name: str) -> Screenshots:
        folder = SCREENSHOTS / re.sub(r"[^\w.-]+", "_", test_name)
        # A test's folder holds this run's pages only, never a page an earlier run visited.
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return cls(folder)

    def take(self, page, name: str) -> None:
        self.count += 1
        for size_name, size in (("desktop", DESKTOP), ("phone", PHONE)):
            page.set_viewport_size(size)
            page.screenshot(path=self.folder / f"{self.count:02d}-{name}-{size_name}.png", full_page=True)
        page.set_viewport_size(DESKTOP)
