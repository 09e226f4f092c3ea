"""A first run as an operator sees it: ``manage.py serve --port 0`` prints the URLs with the port it bound and
records it in ``<state dir>/gateway.json``; the Django-free client (``python -m openclaw_client call``) and
``manage.py gateway call`` find that gateway without ``--url``; a clean stop removes the file, and the file a killed
gateway left behind is ignored with the reason."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from openclaw_client.cli import EXIT_OK, EXIT_UNREACHABLE
from openclaw_client.running_gateway import FILE_NAME
from tests.support.processes import (
    ROOT,
    GatewayLaunch,
    free_port,
    gateway_settings_for_tests,
    read_log,
    stop_process,
)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

START_TIMEOUT_S = 60


@pytest.fixture
def launch():
    launch = GatewayLaunch.prepare(settings=gateway_settings_for_tests(free_port()))
    yield launch
    launch.remove_state()


def serve_on_any_port(launch: GatewayLaunch) -> tuple[subprocess.Popen, dict, str]:
    """``manage.py serve --port 0``; returns once gateway.json names it: (process, the file's content, log path)."""
    log_path = os.path.join(launch.state_dir, "serve.log")
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--port", "0"], cwd=ROOT, env=launch.env, stdout=log, stderr=log
        )
    path = Path(launch.state_dir) / FILE_NAME
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"serve exited with {process.returncode}:\n{read_log(log_path)}")
        if path.exists():
            recorded = json.loads(path.read_text())
            if recorded["pid"] == process.pid and "try it:" in read_log(log_path):
                return process, recorded, log_path
        time.sleep(0.1)
    stop_process(process, signal.SIGKILL, 10)
    raise AssertionError(f"no {path} within {START_TIMEOUT_S} s:\n{read_log(log_path)}")


def client(launch: GatewayLaunch, *argv: str, configured_port: int | None = None) -> subprocess.CompletedProcess:
    """A CLI process in the gateway's state folder with its token and no --url."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("OPENCLAW_GATEWAY_")}
    env.update(OPENCLAW_STATE_DIR=launch.state_dir, OPENCLAW_GATEWAY_TOKEN=launch.token)
    if configured_port:
        env["OPENCLAW_GATEWAY_PORT"] = str(configured_port)
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_the_banner_and_the_cli_follow_the_port_the_gateway_bound(launch):
    process, recorded, log_path = serve_on_any_port(launch)
    try:
        port = recorded["port"]
        assert recorded["url"] == f"ws://127.0.0.1:{port}"
        banner = read_log(log_path)
        for line in (
            f"OpenClaw gateway listening on ws://127.0.0.1:{port}/",
            f"  console:         http://127.0.0.1:{port}/ui/",
            f"  admin:           http://127.0.0.1:{port}/admin/",
            f"  API docs:        http://127.0.0.1:{port}/api/docs",
            f"  gateway socket:  ws://127.0.0.1:{port}/  (token from OPENCLAW_GATEWAY_TOKEN)",
        ):
            assert line in banner
        assert "channel layer" not in banner

        for argv in (("-m", "openclaw_client", "call", "health"), ("manage.py", "gateway", "call", "health")):
            result = client(launch, *argv, configured_port=free_port())
            assert (result.returncode, result.stderr) == (EXIT_OK, ""), result.stderr
            assert json.loads(result.stdout)["ok"] is True
        status = client(launch, "-m", "openclaw_client", "call", "status")
        assert json.loads(status.stdout)["pid"] == process.pid
    finally:
        stop_process(process, signal.SIGTERM, 60)
    assert process.returncode == 0, read_log(log_path)
    assert not (Path(launch.state_dir) / FILE_NAME).exists()


def test_the_file_of_a_killed_gateway_is_ignored_with_the_reason(launch):
    process, _, _ = serve_on_any_port(launch)
    stop_process(process, signal.SIGKILL, 30)
    path = Path(launch.state_dir) / FILE_NAME
    assert path.exists()
    configured = free_port()
    result = client(launch, "-m", "openclaw_client", "call", "health", configured_port=configured)
    assert (result.returncode, result.stdout) == (EXIT_UNREACHABLE, "")
    assert result.stderr == (
        f"error: cannot connect to ws://127.0.0.1:{configured}: connection refused (is the gateway running?) "
        f"({path} names process {process.pid}, which is not running)\n"
    )
