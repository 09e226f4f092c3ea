"""The CLI's failures that a healthy gateway does not produce on demand: a gateway that never answers, closes
mid-handshake or before answering, a server that is not a WebSocket, TLS that fails. Fake servers on 127.0.0.1,
the console script as a subprocess; plus how long the client waits for each method."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http import HTTPStatus
from io import StringIO

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.core.management import CommandError, call_command
from websockets.sync.server import ServerConnection, serve

from openclaw_client.cli import (
    EXIT_METHOD_ERROR,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_TIMEOUT,
    EXIT_UNREACHABLE,
    request_timeout_ms,
)
from tests.support.processes import ROOT, free_port


def cli(state, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("OPENCLAW_GATEWAY_TOKEN", "OPENCLAW_GATEWAY_PASSWORD")}
    environ["OPENCLAW_STATE_DIR"] = str(state)
    return subprocess.run(
        [sys.executable, "-m", "openclaw_client.cli", "call", *args, "--token", "t"],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_fails(result: subprocess.CompletedProcess, exit_code: int, line: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert (result.returncode, result.stdout, result.stderr) == (exit_code, "", line + "\n")


def assert_fails_with_prefix(result: subprocess.CompletedProcess, exit_code: int, prefix: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert (result.returncode, result.stdout, result.stderr.count("\n")) == (exit_code, "", 1), result.stderr
    assert result.stderr.startswith(prefix), result.stderr


# --- fake servers --------------------------------------------------------------------------------

Behaviour = Callable[[ServerConnection, dict], None]


def hello(ws: ServerConnection, connect: dict) -> None:
    ws.send(json.dumps({"type": "res", "id": connect["id"], "ok": True, "payload": {"type": "hello-ok"}}))


def never_answers(ws: ServerConnection, connect: dict) -> None:
    hello(ws, connect)
    for _ in ws:  # reads the request, never answers it
        pass


def closes_during_handshake(ws: ServerConnection, connect: dict) -> None:
    ws.close(1008, "invalid handshake")


def closes_before_answering(ws: ServerConnection, connect: dict) -> None:
    hello(ws, connect)
    ws.recv()
    ws.close(1012, "service restart")


def answers_late(ws: ServerConnection, connect: dict) -> None:
    """Answers agent.wait after 1.5 s, as the gateway does when the wait's timeoutMs passes."""
    hello(ws, connect)
    request = json.loads(ws.recv())
    with contextlib.suppress(TimeoutError):
        ws.recv(timeout=1.5)
    payload = {"runId": request["params"]["runId"], "status": "timeout"}
    ws.send(json.dumps({"type": "res", "id": request["id"], "ok": True, "payload": payload}))
    for _ in ws:
        pass


def answers_with_large_details(ws: ServerConnection, connect: dict) -> None:
    hello(ws, connect)
    request = json.loads(ws.recv())
    error = {"code": "INVALID_REQUEST", "message": "too\nmany", "details": {"items": ["x" * 40] * 10}}
    ws.send(json.dumps({"type": "res", "id": request["id"], "ok": False, "error": error}))
    for _ in ws:
        pass


def refuses(error: dict) -> Behaviour:
    """Answers ``connect`` with ``error`` and closes 1008, as the gateway refuses a handshake."""

    def behaviour(ws: ServerConnection, connect: dict) -> None:
        ws.send(json.dumps({"type": "res", "id": connect["id"], "ok": False, "error": error}))
        ws.close(1008, error["message"][:100])

    return behaviour


@contextlib.contextmanager
def fake_gateway(behaviour: Behaviour | None = None, **serve_kwargs) -> Iterator[int]:
    """A WebSocket server that sends connect.challenge, reads connect, then does ``behaviour``; yields its port."""

    def handler(ws: ServerConnection) -> None:
        ws.send(json.dumps({"type": "event", "event": "connect.challenge", "payload": {"nonce": "n", "ts": 0}}))
        connect = json.loads(ws.recv())
        with contextlib.suppress(Exception):
            behaviour(ws, connect)

    with serve(handler, "127.0.0.1", 0, **serve_kwargs) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield server.socket.getsockname()[1]
        finally:
            server.shutdown()
            thread.join(10)


@contextlib.contextmanager
def raw_server(reply: bytes) -> Iterator[int]:
    """A TCP server that answers every connection with ``reply`` and closes it."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(reply)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(10)
        listener.close()


def self_signed_context(tmp_path) -> ssl.SSLContext:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return context


# --- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "params", "timeout_ms", "expected_ms"),
    [
        ("health", {}, None, 30_000),
        ("health", {}, 500, 500),
        ("agent.wait", {"runId": "r"}, None, 35_000),  # the gateway's own default wait, 30 s, plus 5 s
        ("agent.wait", {"runId": "r"}, 500, 35_000),  # --timeout never cuts the gateway's wait short
        ("agent.wait", {"runId": "r", "timeoutMs": 2_000}, 500, 7_000),
        ("agent.wait", {"runId": "r", "timeoutMs": 120_000}, None, 125_000),
        ("agent.wait", {"runId": "r", "timeoutMs": 2_000}, 60_000, 60_000),
        ("agent.wait", {"runId": "r", "timeoutMs": "soon"}, None, 35_000),  # invalid: the gateway refuses it
        ("node.invoke", {"nodeId": "n", "command": "c"}, None, 35_000),
        ("node.invoke", {"nodeId": "n", "command": "c", "timeoutMs": 90_000}, None, 95_000),
    ],
)
def test_the_client_waits_at_least_as_long_as_the_method_may_take(method, params, timeout_ms, expected_ms):
    assert request_timeout_ms(method, params, timeout_ms) == expected_ms


def test_a_gateway_that_does_not_answer_in_time(tmp_path):
    with fake_gateway(never_answers) as port:
        result = cli(tmp_path, "health", "--url", f"ws://127.0.0.1:{port}", "--timeout", "300")
    assert_fails(result, EXIT_TIMEOUT, "error: gateway did not answer health within 0.3 s")


def test_agent_wait_outlasts_a_shorter_timeout(tmp_path):
    with fake_gateway(answers_late) as port:
        params = json.dumps({"runId": "r1", "timeoutMs": 1000})
        result = cli(tmp_path, "agent.wait", "--params", params, "--url", f"ws://127.0.0.1:{port}", "--timeout", "300")
    assert (result.returncode, result.stderr) == (EXIT_OK, "")
    assert json.loads(result.stdout) == {"runId": "r1", "status": "timeout"}


def test_large_details_of_a_method_error_go_on_a_second_line(tmp_path):
    with fake_gateway(answers_with_large_details) as port:
        result = cli(tmp_path, "health", "--url", f"ws://127.0.0.1:{port}")
    details = json.dumps({"items": ["x" * 40] * 10}, separators=(",", ":"))
    assert (result.returncode, result.stdout) == (EXIT_METHOD_ERROR, "")
    assert result.stderr == f"error: INVALID_REQUEST: too many\ndetails: {details}\n"


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (
            {
                "code": "INVALID_REQUEST",
                "message": "unauthorized: too many failed authentication attempts (retry later)",
                "details": {"code": "AUTH_RATE_LIMITED", "authReason": "rate_limited"},
                "retryable": True,
                "retryAfterMs": 300_000,
            },
            "error: gateway refused the token given with --token (AUTH_RATE_LIMITED); retry in 300 s",
        ),
        (
            {
                "code": "NOT_PAIRED",
                "message": "pairing required: scope upgrade",
                "details": {
                    "code": "PAIRING_REQUIRED",
                    "requestId": "r1",
                    "remediationHint": "approve with: python manage.py pairing approve r1",
                },
            },
            "error: gateway requires pairing (pairing required: scope upgrade); "
            "approve with: python manage.py pairing approve r1",
        ),
        (
            {"code": "INVALID_REQUEST", "message": "protocol mismatch", "details": {"code": "PROTOCOL_UNSUPPORTED"}},
            "error: gateway refused the connection (INVALID_REQUEST/PROTOCOL_UNSUPPORTED: protocol mismatch)",
        ),
    ],
)
def test_refused_handshakes(tmp_path, error, line):
    with fake_gateway(refuses(error)) as port:
        assert_fails(cli(tmp_path, "health", "--url", f"ws://127.0.0.1:{port}"), EXIT_REFUSED, line)


def test_connections_closed_by_the_gateway(tmp_path):
    with fake_gateway(closes_during_handshake) as port:
        url = f"ws://127.0.0.1:{port}"
        assert_fails(
            cli(tmp_path, "health", "--url", url),
            EXIT_UNREACHABLE,
            f"error: cannot connect to {url}: the gateway closed the connection during the handshake "
            "(code 1008: invalid handshake)",
        )
    with fake_gateway(closes_before_answering) as port:
        url = f"ws://127.0.0.1:{port}"
        assert_fails(
            cli(tmp_path, "health", "--url", url),
            EXIT_UNREACHABLE,
            f"error: connection to {url} closed before the gateway answered health (code 1012: service restart)",
        )


def test_servers_that_are_not_a_gateway(tmp_path):
    def not_found(connection, request):
        return connection.respond(HTTPStatus.NOT_FOUND, "no WebSocket here\n")

    with fake_gateway(process_request=not_found) as port:
        url = f"ws://127.0.0.1:{port}"
        assert_fails(
            cli(tmp_path, "health", "--url", url),
            EXIT_UNREACHABLE,
            f"error: cannot connect to {url}: the server answered HTTP 404 instead of a WebSocket upgrade",
        )


def test_tls_failures(tmp_path):
    with fake_gateway(never_answers, ssl=self_signed_context(tmp_path)) as port:
        url = f"wss://127.0.0.1:{port}"
        assert_fails_with_prefix(
            cli(tmp_path, "health", "--url", url),
            EXIT_UNREACHABLE,
            f"error: cannot connect to {url}: TLS certificate not accepted (",
        )
    with raw_server(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n") as port:
        url = f"wss://127.0.0.1:{port}"
        assert_fails_with_prefix(
            cli(tmp_path, "health", "--url", url),
            EXIT_UNREACHABLE,
            f"error: cannot connect to {url}: TLS handshake failed (",
        )


def test_manage_py_command_called_from_code_raises_command_error(settings, tmp_path):
    """``call_command`` gets a CommandError with the exit code (the command line gets the bare exit code)."""
    settings.STATE_DIR = tmp_path
    url = f"ws://127.0.0.1:{free_port()}"
    stderr = StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("gateway", "call", "health", "--url", url, "--token", "t", stderr=stderr)
    assert raised.value.returncode == EXIT_UNREACHABLE
    assert stderr.getvalue() == f"error: cannot connect to {url}: connection refused (is the gateway running?)\n"
