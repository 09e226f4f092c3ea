"""Unexpected failures reach clients as a reference, never as the exception's text; a connection never goes silent."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from gateway import consumers, health, lifecycle
from gateway.consumers import GatewayConsumer
from gateway.dispatch import run_request
from gateway.protocol import RequestFrame
from gateway.registry import EmptyParams, MethodSpec, registry
from tests.support.connections import admin_operator_context

LEAK = 'DataError: value too long for type character varying(200)\nINSERT INTO "sessions_app_session" ("label")'


class DataError(Exception):
    """Stands for a database error whose text carries SQL."""


def _assert_reference(error: dict, caplog) -> str:
    error_id = error["details"]["errorId"]
    assert error == {
        "code": "UNAVAILABLE",
        "message": f"internal error; reference {error_id}",
        "details": {"errorId": error_id},
        "retryable": True,
    }
    # The operator finds the traceback under the same reference.
    logged = [record for record in caplog.records if error_id in record.getMessage()]
    assert logged and logged[0].exc_info is not None
    assert "value too long" in str(logged[0].exc_info[1]) or "db.internal" in str(logged[0].exc_info[1])
    return error_id


def test_a_handler_exception_is_answered_with_a_reference(monkeypatch, caplog):
    async def broken(ctx, params):
        raise DataError(LEAK)

    spec = MethodSpec(
        name="test.broken", handler=broken, params=EmptyParams, role="operator", scope=None, is_async=True
    )
    monkeypatch.setitem(registry.methods, "test.broken", spec)
    frame = RequestFrame(type="req", id="r1", method="test.broken")
    with caplog.at_level(logging.ERROR):
        response = asyncio.run(run_request(admin_operator_context(), frame))

    assert response["id"] == "r1" and response["ok"] is False
    _assert_reference(response["error"], caplog)
    assert "INSERT" not in json.dumps(response) and "DataError" not in json.dumps(response)


def test_a_failed_health_probe_is_answered_with_a_reference(monkeypatch, caplog):
    async def probe_fails():
        raise DataError("could not connect to server: Connection refused, host db.internal port 5432")

    monkeypatch.setattr(health, "health_snapshot", probe_fails)
    with caplog.at_level(logging.ERROR):
        response = asyncio.run(run_request(admin_operator_context(), RequestFrame(type="req", id="h", method="health")))

    _assert_reference(response["error"], caplog)
    assert "db.internal" not in json.dumps(response)


# --- the consumer: sending ---------------------------------------------------------------------


class Recorder:
    def __init__(self, consumer: GatewayConsumer, *, send_fails: bool = False):
        self.sent: list[dict[str, Any]] = []
        self.closed: list[tuple[int, str | None]] = []

        async def send(text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False):
            if send_fails:
                raise RuntimeError("transport refused the frame")
            self.sent.append(json.loads(text_data))

        async def close_socket(code: int | None = None, reason: str | None = None):
            self.closed.append((code, reason))

        consumer.send = send
        consumer.close = close_socket


def _open_consumer(**recorder_options) -> tuple[GatewayConsumer, Recorder]:
    consumer = GatewayConsumer()
    consumer.phase = "open"
    consumer.seq = 0
    return consumer, Recorder(consumer, **recorder_options)


def test_a_response_that_cannot_be_encoded_is_replaced_by_a_reference(caplog):
    consumer, recorder = _open_consumer()
    with caplog.at_level(logging.ERROR):
        asyncio.run(consumer._send_frame({"type": "res", "id": "r1", "ok": True, "payload": {"text": "\ud800"}}))

    [frame] = recorder.sent
    assert frame["id"] == "r1" and frame["ok"] is False
    assert frame["error"]["message"].startswith("internal error; reference ")
    assert recorder.closed == []
    assert consumer.phase == "open"


def test_an_event_that_cannot_be_encoded_closes_the_connection_with_a_reason(caplog):
    consumer, recorder = _open_consumer()
    with caplog.at_level(logging.ERROR):
        asyncio.run(consumer.send_event("chat", {"text": "\udfff"}))

    assert recorder.sent == []
    [(code, reason)] = recorder.closed
    assert code == 1011 and reason.startswith("internal error; reference ")
    assert consumer.phase == "closed"
    assert any(reason.removeprefix("internal error; reference ") in r.getMessage() for r in caplog.records)


def test_a_transport_that_refuses_a_frame_closes_the_connection_with_a_reason(caplog):
    consumer, recorder = _open_consumer(send_fails=True)
    with caplog.at_level(logging.ERROR):
        asyncio.run(consumer._send_frame({"type": "res", "id": "r1", "ok": True, "payload": {}}))

    [(code, reason)] = recorder.closed
    assert code == 1011 and reason.startswith("internal error; reference ")
    assert consumer.phase == "closed"


def test_frames_that_encode_are_sent_as_they_are():
    consumer, recorder = _open_consumer()
    asyncio.run(consumer._send_frame({"type": "res", "id": "r1", "ok": True, "payload": {"text": "é😀"}}))
    assert recorder.sent == [{"type": "res", "id": "r1", "ok": True, "payload": {"text": "é😀"}}]
    assert recorder.closed == []


# --- the consumer: a connect that fails unexpectedly ---------------------------------------------


class _Timer:
    def cancel(self) -> None:
        pass


@pytest.fixture
def handshaking(monkeypatch):
    async def registered() -> None:
        return None

    monkeypatch.setattr(lifecycle, "ensure_process_registered", registered)
    consumer = GatewayConsumer()
    consumer.scope = {"type": "websocket", "headers": [], "client": ("127.0.0.1", 1)}
    consumer.phase = "handshake"
    consumer.conn_id = "conn"
    consumer.nonce = "nonce"
    consumer.channel_name = "inmemory!conn"
    consumer.remote_ip = "127.0.0.1"
    consumer.handshake_timer = _Timer()
    consumer.ctx = None
    return consumer, Recorder(consumer)


def test_a_connect_that_fails_unexpectedly_answers_with_a_reference_and_closes_1011(handshaking, monkeypatch, caplog):
    consumer, recorder = handshaking

    def broken(*args, **kwargs):
        raise DataError(LEAK)

    monkeypatch.setattr(consumers, "accept_connect", broken)
    connect = {
        "type": "req",
        "id": "c1",
        "method": "connect",
        "params": {
            "minProtocol": 3,
            "maxProtocol": 4,
            "client": {"id": "test", "version": "1", "platform": "linux", "mode": "test"},
            "auth": {"token": "t"},
        },
    }
    with caplog.at_level(logging.ERROR):
        asyncio.run(consumer.receive(text_data=json.dumps(connect)))

    [response] = recorder.sent
    assert response["id"] == "c1" and response["ok"] is False
    error_id = _assert_reference(response["error"], caplog)
    assert recorder.closed == [(1011, f"internal error; reference {error_id}")]


def test_any_other_failure_while_handling_a_frame_closes_with_a_reason(handshaking, monkeypatch, caplog):
    consumer, recorder = handshaking

    def broken(raw):
        raise DataError(LEAK)

    monkeypatch.setattr(consumers, "parse_connect", broken)
    with caplog.at_level(logging.ERROR):
        asyncio.run(consumer.receive(text_data='{"type":"req","id":"c1","method":"connect","params":{}}'))

    assert recorder.sent == []
    [(code, reason)] = recorder.closed
    assert code == 1011 and reason.startswith("internal error; reference ")
    assert "value too long" not in reason
