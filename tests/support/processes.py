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

ROOT = Path(__file__).resolve().parent.parent.parent
TEST_TOKEN = "test-gateway-token-0123456789"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def current_database_url(alias: str = "default") -> str:
    """The URL of a database pytest-django created, for processes outside this one."""
    from django.db import connections

    settings = connections[alias].settings_dict
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
    # The Celery worker that runs this gateway's turns (task mode "celery"), started with the same env.
    worker: subprocess.Popen | None = None
    worker_log_path: str | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return Path(self.log_path).read_text(encoding="utf-8", errors="replace")

    def worker_log(self) -> str:
        return Path(self.worker_log_path).read_text(encoding="utf-8", errors="replace") if self.worker_log_path else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        _terminate(self.process, sig, timeout)
        if self.worker is not None:
            _terminate(self.worker, signal.SIGTERM, timeout)
        return self.process.returncode

    def kill_worker(self) -> None:
        if self.worker is not None:
            _terminate(self.worker, signal.SIGKILL, 10)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


def _terminate(process: subprocess.Popen, sig: int, timeout: float) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def task_mode(env: dict[str, str]) -> str:
    return env.get("OPENCLAW_TASK_MODE") or ("celery" if env.get("REDIS_URL") else "inprocess")


def start_celery_worker(env: dict[str, str], state_dir: str) -> tuple[subprocess.Popen, str]:
    log_path = os.path.join(state_dir, "celery.log")
    with open(log_path, "w", encoding="utf-8") as log:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "openclaw_site",
                "worker",
                "--loglevel",
                "INFO",
                "--pool",
                "threads",
                "--concurrency",
                "4",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise RuntimeError(f"celery worker exited with {worker.returncode}:\n{Path(log_path).read_text()}")
        if " ready." in Path(log_path).read_text(encoding="utf-8", errors="replace"):
            return worker, log_path
        time.sleep(0.1)
    worker.kill()
    raise RuntimeError(f"celery worker not ready within 60 s:\n{Path(log_path).read_text()}")


def start_gateway(
    *, extra_env: dict[str, str] | None = None, port: int | None = None, worker: bool = True
) -> GatewayServer:
    port = port or free_port()
    state_dir = tempfile.mkdtemp(prefix="gateway-state-")
    env = {
        **os.environ,
        "DATABASE_URL": current_database_url(),
        "HARNESS_DATABASE_URL": current_database_url("harness"),
        "OPENCLAW_GATEWAY_TOKEN": TEST_TOKEN,
        "OPENCLAW_STATE_DIR": state_dir,
        "PYTHONUNBUFFERED": "1",
        "DB_CONN_MAX_AGE": "60",
        # Each test gateway has its own Celery worker and queue: a worker started with another
        # gateway's settings (say, another model provider) must not take this gateway's turns.
        "OPENCLAW_CELERY_QUEUE": f"openclaw-{port}",
        # Gateways of one test worker share a channel layer (multi-process tests need that);
        # gateways of different xdist workers must not see each other's broadcasts.
        "OPENCLAW_REDIS_PREFIX": f"{os.environ.get('OPENCLAW_REDIS_PREFIX', 'openclaw')}-"
        f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}",
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
    if worker and task_mode(env) == "celery":
        server.worker, server.worker_log_path = start_celery_worker(env, state_dir)
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
