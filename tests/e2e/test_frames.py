"""Bad input after the handshake: every bad frame is answered, nothing is written, the socket stays up."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.db import database_sync_to_async as sync_to_async

from devices_app.models import DevicePairingRequest, DeviceToken, PairedDevice
from gateway.models import AuditLog, GatewayConnection
from tests.support.clients import operator

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _row_counts() -> dict[str, int]:
    return {
        model.__name__: model.objects.count()
        for model in (AuditLog, DevicePairingRequest, DeviceToken, GatewayConnection, PairedDevice)
    }


async def _send_and_read(client, data) -> dict:
    await client.send_raw(data)
    return await asyncio.wait_for(_next_response(client), 10)


async def _next_response(client) -> dict:
    # Responses to frames without a usable id come back as "invalid": read them off the socket.
    while True:
        raw = await client._ws.recv()
        frame = json.loads(raw)
        if frame.get("type") == "res":
            return frame


async def _connected(server):
    client = operator(server)
    await client.connect()
    # Take over the socket: read frames here instead of the client's reader task.
    client._reader.cancel()
    return client


@pytest.mark.parametrize(
    ("data", "expected_id", "message"),
    [
        (
            "{not json",
            "invalid",
            "invalid request frame: malformed JSON (Expecting property name enclosed in double quotes)",
        ),
        ("[1, 2, 3]", "invalid", "invalid request frame: must be an object, got list"),
        ('"just a string"', "invalid", "invalid request frame: must be an object, got str"),
        ("42", "invalid", "invalid request frame: must be an object, got int"),
        ("null", "invalid", "invalid request frame: must be an object, got NoneType"),
        (
            '{"type": "res", "id": "r1"}',
            "r1",
            "invalid request frame: at /type: Input should be 'req'; at /method: must have required property",
        ),
        ('{"type": "req", "id": "r2"}', "r2", "invalid request frame: at /method: must have required property"),
        (
            '{"type": "req", "id": "r3", "method": ""}',
            "r3",
            "invalid request frame: at /method: String should have at least 1 character",
        ),
        (
            '{"type": "req", "id": "r4", "method": "health", "x": 1}',
            "r4",
            "invalid request frame: at /x: unexpected property",
        ),
        (
            '{"type": "req", "method": "health"}',
            "invalid",
            "invalid request frame: at /id: must have required property",
        ),
    ],
)
def test_bad_frames_get_invalid_request_and_the_socket_stays_usable(gateway, data, expected_id, message):
    async def scenario():
        client = await _connected(gateway)
        before = await sync_to_async(_row_counts)()
        response = await _send_and_read(client, data)
        await client.send_raw(json.dumps({"type": "req", "id": "after", "method": "health"}))
        after = await _next_response(client)
        counts = await sync_to_async(_row_counts)()
        await client.close()
        return response, after, before, counts

    response, after, before, counts = asyncio.run(scenario())
    assert response == {
        "type": "res",
        "id": expected_id,
        "ok": False,
        "error": {"code": "INVALID_REQUEST", "message": message},
    }
    assert after["id"] == "after" and after["ok"] is True
    assert counts == before


def test_binary_frames_are_refused(gateway):
    async def scenario():
        client = await _connected(gateway)
        response = await _send_and_read(client, b"\x00\x01binary")
        await client.close()
        return response

    response = asyncio.run(scenario())
    assert response["error"]["message"] == "invalid request frame: text frames only"


def test_frames_over_max_payload_are_refused_without_closing(gateway_factory):
    server = gateway_factory(extra_env={"OPENCLAW_MAX_PAYLOAD_BYTES": "65536"})

    async def scenario():
        client = await _connected(server)
        assert client.hello["policy"]["maxPayload"] == 65536
        # 40,000 code points but 80,000 UTF-8 bytes: the limit is in bytes.
        pad = "é" * 40_000
        big = json.dumps({"type": "req", "id": "big", "method": "health", "params": {"pad": pad}}, ensure_ascii=False)
        response = await _send_and_read(client, big)
        await client.send_raw(json.dumps({"type": "req", "id": "after", "method": "health"}))
        after = await _next_response(client)
        await client.close()
        return response, after

    response, after = asyncio.run(scenario())
    # Read from the frame's head before it is parsed: the client's call completes.
    assert response["id"] == "big"
    assert response["error"] == {
        "code": "INVALID_REQUEST",
        "message": "invalid request frame: frame exceeds maxPayload (65536 bytes)",
    }
    assert after["ok"] is True


def test_a_flood_of_bad_frames_is_answered_and_writes_nothing(gateway):
    bad_frames = ["{", "[]", '{"type":"req"}', '{"type":"req","id":"x","method":"nope"}', "1"] * 100

    async def scenario():
        client = await _connected(gateway)
        before = await sync_to_async(_row_counts)()
        for frame in bad_frames:
            await client.send_raw(frame)
        responses = [await asyncio.wait_for(_next_response(client), 10) for _ in bad_frames]
        await client.send_raw(json.dumps({"type": "req", "id": "after", "method": "node.list"}))
        after = await _next_response(client)
        counts = await sync_to_async(_row_counts)()
        await client.close()
        return responses, after, before, counts

    responses, after, before, counts = asyncio.run(scenario())
    assert len(responses) == len(bad_frames)
    assert all(r["ok"] is False and r["error"]["code"] == "INVALID_REQUEST" for r in responses)
    assert after["ok"] is True and after["payload"]["nodes"] == []
    assert counts == before


def test_cancel_frames_for_unknown_requests_are_ignored(gateway):
    async def scenario():
        client = await _connected(gateway)
        await client.send_raw(json.dumps({"type": "cancel", "id": "never-sent"}))
        await client.send_raw(json.dumps({"type": "req", "id": "after", "method": "health"}))
        after = await _next_response(client)
        await client.close()
        return after

    assert asyncio.run(scenario())["ok"] is True


def test_frames_over_the_transport_limit_close_with_1009(gateway_factory):
    server = gateway_factory(extra_env={"OPENCLAW_MAX_PAYLOAD_BYTES": "65536"})

    async def scenario():
        client = await _connected(server)
        await client.send_raw(json.dumps({"type": "req", "id": "huge", "method": "health", "params": "x" * 200_000}))
        await asyncio.wait_for(client._ws.wait_closed(), 10)
        return client._ws.close_code

    assert asyncio.run(scenario()) == 1009
