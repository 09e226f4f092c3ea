"""Right after a start, operators' reads wait for startup reconciliation (bounded), over the wire and over HTTP;
a node's own calls and the probes do not wait."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway import scopes as sc
from gateway import state
from gateway.dispatch import STILL_STARTING, run_request
from gateway.protocol import RequestFrame
from gateway.registry import EmptyParams, MethodSpec, registry
from gateway.startup_gate import StartupGate
from tests.support.connections import admin_operator_context


@pytest.fixture(autouse=True)
def _serving_again():
    yield
    state.startup_finished()


@pytest.fixture
def read_method(monkeypatch):
    calls: list[str] = []

    async def read(ctx, params):
        calls.append(ctx.role)
        return {"read": True}

    for role in (sc.ROLE_OPERATOR, sc.ROLE_NODE):
        name = f"test.read.{role}"
        spec = MethodSpec(name=name, handler=read, params=EmptyParams, role=role, scope=None, is_async=True)
        monkeypatch.setitem(registry.methods, name, spec)
    return calls


def operator_frame() -> RequestFrame:
    return RequestFrame(type="req", id="r1", method=f"test.read.{sc.ROLE_OPERATOR}")


def test_a_process_that_never_started_reconciling_serves_at_once(read_method):
    response = asyncio.run(run_request(admin_operator_context(), operator_frame()))
    assert response["ok"] is True and read_method == [sc.ROLE_OPERATOR]


def test_an_operators_read_waits_for_startup_reconciliation(read_method):
    async def scenario() -> tuple[bool, dict]:
        state.startup_begun()
        pending = asyncio.ensure_future(run_request(admin_operator_context(), operator_frame()))
        for _ in range(20):
            await asyncio.sleep(0)
        answered_early = pending.done()
        state.startup_finished()
        return answered_early, await pending

    answered_early, response = asyncio.run(scenario())
    assert answered_early is False
    assert response["ok"] is True and read_method == [sc.ROLE_OPERATOR]


def test_a_read_past_the_wait_is_unavailable_and_runs_nothing(read_method, settings):
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "STARTUP_READ_WAIT_MS": 0}

    async def scenario() -> dict:
        state.startup_begun()
        return await run_request(admin_operator_context(), operator_frame())

    response = asyncio.run(scenario())
    assert response["ok"] is False
    assert response["error"]["code"] == "UNAVAILABLE" and response["error"]["message"] == STILL_STARTING
    assert response["error"]["retryable"] is True
    assert read_method == []


def test_a_nodes_calls_do_not_wait(read_method, settings):
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "STARTUP_READ_WAIT_MS": 0}
    node = admin_operator_context()
    node.role = sc.ROLE_NODE

    async def scenario() -> dict:
        state.startup_begun()
        return await run_request(node, RequestFrame(type="req", id="n1", method=f"test.read.{sc.ROLE_NODE}"))

    assert asyncio.run(scenario())["ok"] is True and read_method == [sc.ROLE_NODE]


async def _http(app, path: str) -> tuple[int, bytes]:
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    await app({"type": "http", "path": path, "method": "GET", "headers": []}, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


async def _ok_app(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": scope["path"].encode()})


def test_http_reads_wait_and_probes_do_not(settings):
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "STARTUP_READ_WAIT_MS": 0}
    gate = StartupGate(_ok_app, exempt_paths=("/healthz",))

    async def scenario() -> list[tuple[int, bytes]]:
        state.startup_begun()
        during = [await _http(gate, "/api/sessions"), await _http(gate, "/healthz")]
        state.startup_finished()
        return [*during, await _http(gate, "/api/sessions")]

    (refused, body), probe, after = asyncio.run(scenario())
    assert refused == 503
    assert json.loads(body)["error"] == {
        "code": "UNAVAILABLE",
        "message": STILL_STARTING,
        "retryable": True,
        "retryAfterMs": 1000,
    }
    assert probe == (200, b"/healthz")
    assert after == (200, b"/api/sessions")


def test_an_http_read_during_startup_is_answered_once_it_has_finished():
    gate = StartupGate(_ok_app, exempt_paths=())

    async def scenario() -> tuple[bool, tuple[int, bytes]]:
        state.startup_begun()
        pending = asyncio.ensure_future(_http(gate, "/ui/sessions/"))
        for _ in range(20):
            await asyncio.sleep(0)
        early = pending.done()
        state.startup_finished()
        return early, await pending

    early, answer = asyncio.run(scenario())
    assert early is False and answer == (200, b"/ui/sessions/")
