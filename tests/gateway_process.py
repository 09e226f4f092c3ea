"""Start real gateway processes (``manage.py serve`` under Daphne) for end-to-end tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
TEST_TOKEN = "test-gateway-token-0123456789"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_database_url() -> str:
    """The URL of the database pytest-django created, for processes outside this one."""
    settings = connection.settings_dict
    if settings["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{settings['NAME']}"
    user = settings.get("USER") or ""
    password = settings.get("PASSWORD") or ""
    credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host, port = settings.get("HOST") or "127.0.0.1", settings.get("PORT") or 5432
    return f"postgres://{credentials}{host}:{port}/{settings['NAME']}"


@dataclass
class GatewayServer:
    process: subprocess.Popen
    port: int
    token: str
    state_dir: str
    log_path: str
    env: dict[str, str] = field(repr=False, default_factory=dict)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return Path(self.log_path).read_text(encoding="utf-8", errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return self.process.returncode

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


def start_gateway(*, extra_env: dict[str, str] | None = None, port: int | None = None) -> GatewayServer:
    port = port or free_port()
    state_dir = tempfile.mkdtemp(prefix="gateway-state-")
    env = {
        **os.environ,
        "DATABASE_URL": test_database_url(),
        "OPENCLAW_GATEWAY_TOKEN": TEST_TOKEN,
        "OPENCLAW_STATE_DIR": state_dir,
        "PYTHONUNBUFFERED": "1",
        "DB_CONN_MAX_AGE": "60",
        **(extra_env or {}),
    }
    log_path = os.path.join(state_dir, "gateway.log")
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = GatewayServer(process, port, env["OPENCLAW_GATEWAY_TOKEN"], state_dir, log_path, env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited with {process.returncode}:\n{server.log()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return server
        except OSError:
            time.sleep(0.05)
    server.kill()
    raise RuntimeError(f"gateway did not listen on {port} within 30 s:\n{server.log()}")
