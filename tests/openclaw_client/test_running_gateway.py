"""``<state dir>/gateway.json`` (openclaw_client.running_gateway) and how the Django-free CLI picks its gateway from
it: the file of a running gateway is used, a missing, stale (dead process) or malformed one is ignored for the
configured address, and ``--url`` always wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from openclaw_client.cli import EXIT_UNREACHABLE, EXIT_USAGE, main
from openclaw_client.running_gateway import (
    FILE_NAME,
    RunningGateway,
    default_url,
    read_gateway_file,
    remove_gateway_file,
    write_gateway_file,
)
from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
# Modules a Django-free start must not load: the server stack (and what its settings import).
SERVER_PACKAGES = ("django", "channels", "daphne", "twisted", "celery", "gateway", "openclaw_site")


@pytest.fixture
def state(tmp_path) -> Path:
    path = tmp_path / "state"
    path.mkdir()
    return path


@pytest.fixture
def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(timeout=30)
    return process.pid


def test_a_written_file_is_read_back_and_leaves_no_temporary_file(state):
    path = write_gateway_file(state, bind="0.0.0.0", port=43210)
    assert path == state / FILE_NAME
    assert json.loads(path.read_text()) == {
        "url": "ws://127.0.0.1:43210",
        "port": 43210,
        "bind": "0.0.0.0",
        "pid": os.getpid(),
    }
    assert [entry.name for entry in state.iterdir()] == [FILE_NAME]
    reading = read_gateway_file(state)
    assert reading.gateway == RunningGateway(url="ws://127.0.0.1:43210", port=43210, pid=os.getpid())
    assert reading.ignored_because is None
    assert default_url(state, port=1) == "ws://127.0.0.1:43210"


def test_an_ipv6_bind_address_is_bracketed_in_the_url(state):
    write_gateway_file(state, bind="::1", port=43210)
    assert read_gateway_file(state).gateway.url == "ws://[::1]:43210"


def test_a_missing_file_falls_back_to_the_configured_address(state):
    reading = read_gateway_file(state)
    assert (reading.gateway, reading.ignored_because) == (None, None)
    assert default_url(state, bind="127.0.0.2", port=40001) == "ws://127.0.0.2:40001"


def test_the_file_of_a_process_that_is_gone_is_ignored(state, dead_pid):
    write_gateway_file(state, bind="127.0.0.1", port=43210, pid=dead_pid)
    reading = read_gateway_file(state)
    assert reading.gateway is None
    assert reading.ignored_because == f"{state / FILE_NAME} names process {dead_pid}, which is not running"
    assert default_url(state, port=40001) == "ws://127.0.0.1:40001"


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("{not json", "cannot be read (JSONDecodeError)"),
        (b"\xff\xfe", "cannot be read (UnicodeDecodeError)"),
        ("[1, 2]", "does not name a gateway (url, port, pid)"),
        ('{"url": "http://127.0.0.1:1", "port": 1, "pid": 1}', "does not name a gateway (url, port, pid)"),
        ('{"url": "ws://127.0.0.1:70000", "port": 70000, "pid": 1}', "does not name a gateway (url, port, pid)"),
        ('{"url": "ws://127.0.0.1:1", "port": "1", "pid": 1}', "does not name a gateway (url, port, pid)"),
        ('{"url": "ws://127.0.0.1:1", "port": 1, "pid": true}', "does not name a gateway (url, port, pid)"),
        ('{"url": "ws://127.0.0.1:1", "port": 1}', "does not name a gateway (url, port, pid)"),
    ],
)
def test_a_malformed_file_is_ignored_with_the_reason(state, content, why):
    path = state / FILE_NAME
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    reading = read_gateway_file(state)
    assert (reading.gateway, reading.ignored_because) == (None, f"{path} {why}")
    assert default_url(state, port=40001) == "ws://127.0.0.1:40001"


def test_a_stopping_gateway_removes_only_its_own_file(state, dead_pid):
    write_gateway_file(state, bind="127.0.0.1", port=43210, pid=dead_pid)
    # Another gateway of this state folder wrote the file after this one started: it stays.
    assert remove_gateway_file(state) is False
    assert (state / FILE_NAME).exists()
    assert remove_gateway_file(state, pid=dead_pid) is True
    assert not (state / FILE_NAME).exists()
    assert remove_gateway_file(state) is False  # nothing left to remove


# --- the Django-free CLI's choice of gateway -------------------------------------------------------


@pytest.fixture
def cli_env(monkeypatch, state):
    """The CLI's environment: ``state`` as its state folder, a token, no configured address."""
    monkeypatch.setenv("OPENCLAW_STATE_DIR", str(state))
    monkeypatch.setenv("OPENCLAW_GATEWAY_TOKEN", "some-token")
    for name in ("OPENCLAW_GATEWAY_PASSWORD", "OPENCLAW_GATEWAY_BIND", "OPENCLAW_GATEWAY_PORT"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def refused(port: int, note: str = "") -> str:
    return f"error: cannot connect to ws://127.0.0.1:{port}: connection refused (is the gateway running?){note}\n"


def test_the_call_goes_to_the_gateway_of_the_state_file(cli_env, state, capsys):
    recorded = free_port()
    write_gateway_file(state, bind="127.0.0.1", port=recorded)
    cli_env.setenv("OPENCLAW_GATEWAY_PORT", str(free_port()))
    assert main(["call", "health"]) == EXIT_UNREACHABLE
    assert capsys.readouterr().err == refused(recorded)


def test_an_explicit_url_wins_over_the_state_file(cli_env, state, capsys):
    write_gateway_file(state, bind="127.0.0.1", port=free_port())
    given = free_port()
    assert main(["call", "health", "--url", f"ws://127.0.0.1:{given}"]) == EXIT_UNREACHABLE
    assert capsys.readouterr().err == refused(given)


def test_a_stale_state_file_falls_back_to_the_configured_port_and_says_why(cli_env, state, capsys, dead_pid):
    write_gateway_file(state, bind="127.0.0.1", port=free_port(), pid=dead_pid)
    configured = free_port()
    cli_env.setenv("OPENCLAW_GATEWAY_PORT", str(configured))
    assert main(["call", "health"]) == EXIT_UNREACHABLE
    note = f" ({state / FILE_NAME} names process {dead_pid}, which is not running)"
    assert capsys.readouterr().err == refused(configured, note)


@pytest.mark.parametrize("port", ["abc", "70000", "-1"])
def test_an_unusable_configured_port_is_a_usage_error(cli_env, capsys, port):
    cli_env.setenv("OPENCLAW_GATEWAY_PORT", port)
    assert main(["call", "health"]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"error: OPENCLAW_GATEWAY_PORT must be a port number from 0 to 65535: {port!r}\n"
    )


def test_port_0_uses_the_state_file_and_without_one_asks_for_a_url(cli_env, state, capsys):
    cli_env.setenv("OPENCLAW_GATEWAY_PORT", "0")
    assert main(["call", "health"]) == EXIT_UNREACHABLE
    assert capsys.readouterr().err == (
        f"error: no running gateway recorded ({state / FILE_NAME} does not exist) and OPENCLAW_GATEWAY_PORT is 0 "
        "(picked at start): pass --url\n"
    )
    recorded = free_port()
    write_gateway_file(state, bind="127.0.0.1", port=recorded)
    assert main(["call", "health"]) == EXIT_UNREACHABLE
    assert capsys.readouterr().err == refused(recorded)


# --- a fast start: no server stack ---------------------------------------------------------------


def imported_modules(argv: list[str]) -> tuple[subprocess.CompletedProcess, set[str]]:
    """``argv`` run with ``-X importtime``: its result and the top-level packages it imported."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    modules = {
        line.rsplit("|", 1)[-1].strip().split(".")[0]
        for line in result.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return result, modules


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "openclaw_client", "--help"],
        ["-m", "openclaw_client", "call", "--help"],
        ["manage.py", "gateway", "call", "--help"],
    ],
)
def test_the_client_entry_points_start_without_the_server_stack(argv):
    result, modules = imported_modules(argv)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "call" in result.stdout
    assert "openclaw_client" in modules
    assert modules.isdisjoint(SERVER_PACKAGES), sorted(modules.intersection(SERVER_PACKAGES))


def test_manage_py_with_a_django_option_still_goes_through_django():
    result, modules = imported_modules(["manage.py", "gateway", "--traceback", "call", "--help"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "django" in modules
