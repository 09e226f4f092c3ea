"""``manage.py gateway call`` and the console script against a real gateway, as a user runs them: subprocesses,
exact stdout/stderr and exit codes. Every failure is one ``error: …`` line on stderr, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from openclaw_client.cli import (
    EXIT_METHOD_ERROR,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
)
from tests.support.mock_openai import hang_before_headers
from tests.support.processes import ROOT, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FRONT_ENDS = {
    "manage.py": [sys.executable, "manage.py", "gateway", "call"],
    # What the console script `openclaw-gateway` runs (pyproject [project.scripts]: openclaw_client.cli:main).
    "openclaw-gateway": [sys.executable, "-m", "openclaw_client.cli", "call"],
}
front_ends = pytest.mark.parametrize("front_end", list(FRONT_ENDS))


def cli(front_end: str, state: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60):
    """The CLI with ``state`` as OPENCLAW_STATE_DIR (so ``<state>/cli`` is its identity) and no configured secret."""
    environ = {k: v for k, v in os.environ.items() if k not in ("OPENCLAW_GATEWAY_TOKEN", "OPENCLAW_GATEWAY_PASSWORD")}
    environ.update({"OPENCLAW_STATE_DIR": str(state), "PYTHONUNBUFFERED": "1", **(env or {})})
    return subprocess.run(
        [*FRONT_ENDS[front_end], *args], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=timeout
    )


def assert_fails(result: subprocess.CompletedProcess, exit_code: int, line: str) -> None:
    """Exactly one line on stderr, nothing on stdout, the exit code of that kind of failure."""
    assert "Traceback" not in result.stderr, result.stderr
    assert (result.returncode, result.stdout, result.stderr) == (exit_code, "", line + "\n")


def assert_ok(result: subprocess.CompletedProcess, stderr: str = "") -> object:
    assert "Traceback" not in result.stderr, result.stderr
    assert (result.returncode, result.stderr) == (EXIT_OK, stderr), result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def state(tmp_path) -> Path:
    """A fresh OPENCLAW_STATE_DIR for the CLI process: no gateway token file, no stored device token."""
    path = tmp_path.resolve() / "state"
    path.mkdir()
    return path


@front_ends
def test_success_prints_the_payload_and_a_method_error_one_line(gateway, state, front_end):
    base = ("--url", gateway.url, "--token", gateway.token)
    health = assert_ok(cli(front_end, state, "health", *base))
    assert health["ok"] is True
    wait = cli(front_end, state, "agent.wait", "--params", '{"runId":"no-such-run","timeoutMs":0}', *base)
    assert assert_ok(wait) == {"runId": "no-such-run", "status": "timeout"}

    assert_fails(
        cli(front_end, state, "no.such.method", *base),
        EXIT_METHOD_ERROR,
        "error: INVALID_REQUEST: unknown method: no.such.method",
    )
    invoke = json.dumps({"nodeId": "no-such-node", "command": "echo", "idempotencyKey": "k"})
    assert_fails(
        cli(front_end, state, "node.invoke", "--params", invoke, *base),
        EXIT_METHOD_ERROR,
        'error: UNAVAILABLE: node not connected; details: {"code":"NOT_CONNECTED"}',
    )
    # Validation errors: one line, whatever the wording of the gateway's message.
    invalid = cli(front_end, state, "agent.wait", "--params", '{"runId":"r","timeoutMs":-1}', *base)
    assert (invalid.returncode, invalid.stdout, invalid.stderr.count("\n")) == (EXIT_METHOD_ERROR, "", 1)
    assert invalid.stderr.startswith("error: INVALID_REQUEST: ") and "Traceback" not in invalid.stderr

    assert_fails(
        cli(front_end, state, "health", "--params", "{not json", *base),
        EXIT_USAGE,
        "error: --params is not valid JSON: "
        "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
    )


@front_ends
def test_a_gateway_that_is_down_is_one_line(state, front_end):
    url = f"ws://127.0.0.1:{free_port()}"
    assert_fails(
        cli(front_end, state, "health", "--url", url, "--token", "t"),
        EXIT_UNREACHABLE,
        f"error: cannot connect to {url}: connection refused (is the gateway running?)",
    )
    assert_fails(
        cli(front_end, state, "health", "--url", "ws://no-such-host.invalid:18789", "--token", "t"),
        EXIT_UNREACHABLE,
        "error: cannot connect to ws://no-such-host.invalid:18789: cannot resolve host no-such-host.invalid "
        f"({_resolver_error('no-such-host.invalid')})",
    )
    assert_fails(
        cli(front_end, state, "health", "--url", "http://127.0.0.1:1", "--token", "t"),
        EXIT_USAGE,
        "error: --url http://127.0.0.1:1 is not a WebSocket URL (scheme isn't ws or wss)",
    )


def _resolver_error(host: str) -> str:
    import socket

    try:
        socket.getaddrinfo(host, 1)
    except socket.gaierror as error:
        return error.strerror
    raise AssertionError(f"{host} resolves")


@front_ends
def test_a_given_token_is_used_as_given_and_never_falls_back_to_the_device_token(gateway, state, front_end):
    url = ("--url", gateway.url)
    # A first call with the right token pairs this CLI: its device token is stored in <state>/cli.
    assert_ok(cli(front_end, state, "health", *url, "--token", gateway.token))
    stored = json.loads((state / "cli" / "identity" / "device-auth.json").read_text())
    assert stored["tokens"]["operator"]["token"]

    # A wrong token is refused, although the stored device token would have been accepted.
    assert_fails(
        cli(front_end, state, "health", *url, "--token", "wrong-token"),
        EXIT_REFUSED,
        "error: gateway refused the token given with --token (AUTH_TOKEN_MISMATCH)",
    )
    assert_fails(
        cli(front_end, state, "health", *url, "--password", "wrong-password"),
        EXIT_REFUSED,
        "error: gateway refused the password given with --password (AUTH_PASSWORD_NOT_CONFIGURED)",
    )
    # A configured secret is used as given too, and the refusal names where it came from.
    assert_fails(
        cli(front_end, state, "health", *url, env={"OPENCLAW_GATEWAY_TOKEN": "wrong-token"}),
        EXIT_REFUSED,
        "error: gateway refused the token from OPENCLAW_GATEWAY_TOKEN (AUTH_TOKEN_MISMATCH)",
    )
    (state / "gateway-token").write_text("stale-token\n")
    assert_fails(
        cli(front_end, state, "health", *url),
        EXIT_REFUSED,
        f"error: gateway refused the token in {state / 'gateway-token'} (AUTH_TOKEN_MISMATCH)",
    )
    (state / "gateway-token").unlink()

    # No secret given or configured: the stored device token, and the CLI says so.
    announced = f"using the device token stored in {state / 'cli'}\n"
    assert assert_ok(cli(front_end, state, "health", *url), stderr=announced)["ok"] is True

    # Once revoked, the device token is refused by name.
    device_id = json.loads((state / "cli" / "identity" / "device.json").read_text())["deviceId"]
    revoke = json.dumps({"deviceId": device_id, "role": "operator"})
    assert_ok(cli(front_end, state, "device.token.revoke", "--params", revoke, *url, "--token", gateway.token))
    result = cli(front_end, state, "health", *url)
    assert "Traceback" not in result.stderr
    assert (result.returncode, result.stdout, result.stderr) == (
        EXIT_REFUSED,
        "",
        announced + f"error: gateway refused the device token stored in {state / 'cli'} (AUTH_DEVICE_TOKEN_MISMATCH); "
        "pass --token to pair this CLI again\n",
    )


@front_ends
def test_no_token_at_all_says_so(gateway, state, front_end):
    assert_fails(
        cli(front_end, state, "health", "--url", gateway.url),
        EXIT_REFUSED,
        "error: no gateway token: pass --token or --password (none found in OPENCLAW_GATEWAY_TOKEN, "
        f"OPENCLAW_GATEWAY_PASSWORD, {state / 'gateway-token'}; no device token stored in {state / 'cli'})",
    )


def test_agent_wait_gets_the_gateways_timeout_answer_not_a_client_give_up(gateway_factory, mock_openai, tmp_path):
    """The client waits for agent.wait's own timeoutMs (plus a margin), even past a shorter --timeout: a run that
    never finishes comes back as ``status: "timeout"`` from the gateway, exit 0."""
    server = gateway_factory(
        extra_env={
            "OPENCLAW_MODEL_BASE_URL": mock_openai.base_url,
            "OPENCLAW_MODEL_API_KEY": "sk-test",
            "OPENCLAW_MODEL": "mock-model",
            "OPENCLAW_MODEL_READ_TIMEOUT_S": "120",
        }
    )
    for n, front_end in enumerate(FRONT_ENDS):
        state = tmp_path.resolve() / f"state-{n}"
        state.mkdir()
        base = ("--url", server.url, "--token", server.token)
        mock_openai.script(hang_before_headers(120))  # the turn never gets a reply
        send = {"sessionKey": f"cli-wait-{n}", "message": "hello", "idempotencyKey": f"cli-wait-{n}"}
        assert_ok(cli(front_end, state, "sessions.create", "--params", json.dumps({"key": send["sessionKey"]}), *base))
        run_id = assert_ok(cli(front_end, state, "chat.send", "--params", json.dumps(send), *base))["runId"]

        started = time.monotonic()
        wait = json.dumps({"runId": run_id, "timeoutMs": 2000})
        result = cli(front_end, state, "agent.wait", "--params", wait, "--timeout", "500", *base)
        elapsed = time.monotonic() - started
        assert assert_ok(result) == {"runId": run_id, "status": "timeout"}
        assert elapsed >= 2.0

        abort = json.dumps({"sessionKey": send["sessionKey"], "runId": run_id})
        # The run was real and still unfinished: abort stops it.
        assert assert_ok(cli(front_end, state, "chat.abort", "--params", abort, *base))["runIds"] == [run_id]
