"""A gateway process started as the README does answers ``/readyz`` from its dependencies: when its database goes
away (a TCP proxy between it and PostgreSQL is cut) it says not-ready within seconds, stays live (``/healthz``),
and is ready again once the database is back; the internal error a client got meanwhile is recorded for the System
page once the database is back. The shared PostgreSQL server itself is never stopped.

Its address ``/`` sends a browser to the console and still takes OpenClaw clients' WebSocket."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.error
import urllib.request

import pytest
from django.db import connections

from gateway.exceptions import DATABASE_UNAVAILABLE_MESSAGE
from openclaw_client.client import GatewayError
from operations_app.models import RecordedError
from tests.support.clients import operator, raw_socket
from tests.support.processes import current_database_url, start_gateway, stop_and_remove
from tests.support.tcp_proxy import TcpProxy

# Both databases: the gateway started here opens the harness store too (pytest-django creates only those asked for).
pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True, databases="__all__")]

# Generous bounds for a shared, noisy machine: the checks themselves give up after 2 s (operations_app/health.py).
NOTICE_WITHIN_S = 20.0
ANSWER_TIMEOUT_S = 15.0
# The gateway's recorder retries after 1, 2, 5, 10, 20 and 30 s (operations_app/errors.py).
RECORDED_WITHIN_S = 90.0


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=ANSWER_TIMEOUT_S) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def readiness_becomes(server, status: int) -> tuple[dict, float]:
    """Poll ``/readyz`` until it answers ``status``; its body then and the seconds it took."""
    started = time.monotonic()
    last: tuple[int, dict] | None = None
    while time.monotonic() - started < NOTICE_WITHIN_S:
        last = get(f"{server.http_url}/readyz")
        if last[0] == status:
            return last[1], time.monotonic() - started
        time.sleep(0.2)
    raise AssertionError(f"/readyz did not answer {status} within {NOTICE_WITHIN_S} s: {last}\n{server.log()}")


async def call_refused(client, method: str) -> dict:
    try:
        payload = await client.request(method, {}, timeout=ANSWER_TIMEOUT_S * 2)
    except GatewayError as refused:
        return refused.shape
    finally:
        await client.close()
    raise AssertionError(f"{method} answered without its database: {payload}")


def recorded_eventually(error_id: str) -> RecordedError:
    deadline = time.monotonic() + RECORDED_WITHIN_S
    while time.monotonic() < deadline:
        recorded = RecordedError.objects.filter(error_id=error_id).first()
        if recorded is not None:
            return recorded
        time.sleep(0.5)
    raise AssertionError(f"internal error {error_id} not recorded within {RECORDED_WITHIN_S} s")


def test_a_gateway_that_loses_its_database_is_not_ready_until_it_returns(capsys):
    database = connections["default"].settings_dict
    if connections["default"].vendor != "postgresql":
        pytest.skip("needs PostgreSQL behind a proxy (the embedded profile: tests/operations_app/test_health.py)")
    host, port = database["HOST"] or "127.0.0.1", int(database["PORT"] or 5432)
    with TcpProxy(host, port) as proxy:
        proxied = current_database_url().replace(f"@{host}:{port}/", f"@127.0.0.1:{proxy.port}/")
        assert str(proxy.port) in proxied
        server = start_gateway(extra_env={"DATABASE_URL": proxied}, worker=False)
        # One event loop for the client across the steps (it connects before the cut and calls during it).
        runner = asyncio.Runner()
        try:
            ready, _ = readiness_becomes(server, 200)
            assert ready["checks"]["database"]["state"] == "ok"
            client = operator(server)
            runner.run(client.connect())

            proxy.cut()
            not_ready, noticed_after = readiness_becomes(server, 503)
            live = get(f"{server.http_url}/healthz")
            refused = runner.run(call_refused(client, "sessions.list"))

            proxy.restore()
            ready_again, recovered_after = readiness_becomes(server, 200)
            recorded = recorded_eventually(refused["details"]["errorId"])
        finally:
            runner.close()
            proxy.restore()
            stop_and_remove([server])

    assert not_ready["status"] == "not ready"
    assert not_ready["checks"]["database"]["state"] in ("failing", "timeout"), not_ready
    assert not_ready["checks"]["database"].get("reason") in ("unreachable", "no answer within 2 s"), not_ready
    # Liveness asks nothing of the database: the process is not to be restarted for it.
    assert live == (200, {"status": "ok"})
    assert ready_again["status"] == "ready" and ready_again["checks"]["database"]["state"] == "ok"
    # The client was told no connection could be had (with a reference), never the database's error text; the System
    # page has it once the database is back.
    assert refused["code"] == "UNAVAILABLE" and refused["retryable"] is True
    # No connection could be had (told as such, psycopg's pool timeout) or the one it had broke (told by reference).
    assert refused["message"] == DATABASE_UNAVAILABLE_MESSAGE or refused["message"].startswith("internal error; ")
    assert (recorded.context, recorded.pid) == ("gateway method sessions.list", server.pid)
    assert recorded.exception_class
    with capsys.disabled():
        print(f"\nreadiness: database cut noticed after {noticed_after:.1f} s, back after {recovered_after:.1f} s")


def test_the_gateway_address_sends_browsers_to_the_console_and_keeps_its_websocket(gateway):
    browser = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=ANSWER_TIMEOUT_S)
    try:
        browser.request("GET", "/")
        answer = browser.getresponse()
        answer.read()
    finally:
        browser.close()

    async def over_the_socket() -> tuple[str, dict, dict]:
        # ``gateway.url`` is ws://127.0.0.1:<port>, the path ``/`` that browsers are redirected from.
        ws, nonce = await raw_socket(gateway)
        await ws.close()
        client = operator(gateway)
        hello = await client.connect()
        health = await client.request("health", {})
        await client.close()
        return nonce, hello, health

    nonce, hello, health = asyncio.run(over_the_socket())

    assert answer.status == 302
    assert answer.getheader("Location") == "/ui/login/"
    assert nonce  # connect.challenge, as on every gateway socket
    assert hello["type"] == "hello-ok"
    assert health["ok"] is True
