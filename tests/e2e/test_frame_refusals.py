"""Refused frames are answered under the request's own id, and big frames keep within their limits, over real
sockets against a real gateway process (issue 27).

A client matches answers by id: a frame that is JSON but beyond the wire's bounds (a number out of range, a
lone surrogate, nesting deeper than 64), or over its method's size limit, must be answered under the id it
carries, or the client's call never completes. Only text that is not JSON at all is answered under "invalid".
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from channels.db import database_sync_to_async as sync_to_async

from gateway.protocol import MAX_JSON_DEPTH, MAX_SAFE_INTEGER
from openclaw_client.client import GatewayError
from sessions_app.models import Run, Session, TranscriptEvent
from sessions_app.schemas import MAX_MESSAGE_CHARS, MESSAGE_FRAME_BYTES
from tests.support.clients import operator, paired_node

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

INT_REASON = f"invalid request frame: integer out of range (must be within ±{MAX_SAFE_INTEGER})"
SURROGATE_REASON = "invalid request frame: lone surrogate in a string (not valid UTF-8 text)"
DEEP_REASON = f"invalid request frame: nested deeper than {MAX_JSON_DEPTH} levels"


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _row_counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in (Session, Run, TranscriptEvent)}


async def _refusal_of(client, method: str, params: Any) -> GatewayError:
    """The call's own answer, matched by the client under the id it sent (a wrong id would time out)."""
    try:
        await client.request(method, params, timeout=15)
    except GatewayError as error:
        return error
    raise AssertionError(f"{method} was not refused")


# The client writes these with json.dumps: 9007199254740993, "\ud800", 65 levels of arrays.
BEYOND_THE_BOUNDS = [
    pytest.param({"x": MAX_SAFE_INTEGER + 2}, INT_REASON, id="integer"),
    pytest.param({"x": -(MAX_SAFE_INTEGER + 2)}, INT_REASON, id="negative-integer"),
    pytest.param({"x": "\ud800"}, SURROGATE_REASON, id="surrogate-value"),
    pytest.param({"\udc00": 1}, SURROGATE_REASON, id="surrogate-key"),
    pytest.param({"x": _nested(MAX_JSON_DEPTH)}, DEEP_REASON, id="depth"),
]


@pytest.mark.parametrize(("params", "reason"), BEYOND_THE_BOUNDS)
def test_an_operators_call_refused_at_decode_completes_with_its_answer(gateway, params, reason):
    async def scenario():
        client = operator(gateway)
        await client.connect()
        try:
            refused = await _refusal_of(client, "health", params)
            after = await client.request("health", timeout=10)
        finally:
            await client.close()
        return refused, after

    refused, after = asyncio.run(scenario())
    assert (refused.code, refused.message) == ("INVALID_REQUEST", reason)
    assert after["ok"] is True


@pytest.mark.parametrize(("params", "reason"), BEYOND_THE_BOUNDS)
def test_a_nodes_call_refused_at_decode_completes_with_its_answer(gateway, params, reason):
    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        worker = await paired_node(gateway, admin, invoke_handler=None)
        try:
            refused = await _refusal_of(worker, "node.event", {"event": "node.presence.alive", "payload": params})
            after = await worker.request("health", timeout=10)
        finally:
            await worker.close()
            await admin.close()
        return refused, after

    refused, after = asyncio.run(scenario())
    assert (refused.code, refused.message) == ("INVALID_REQUEST", reason)
    assert after["ok"] is True


async def _connected_reading_raw(server):
    client = operator(server)
    await client.connect()
    client._reader.cancel()  # this test reads the frames itself
    return client


async def _answer(client, request_id: str) -> dict:
    while True:
        frame = json.loads(await asyncio.wait_for(client._ws.recv(), 15))
        if frame.get("type") == "res" and frame.get("id") in (request_id, "invalid"):
            return frame


@pytest.mark.parametrize(
    ("text", "request_id", "reason"),
    [
        # The frame of the issue, byte for byte.
        ('{"type":"req","id":"a6","method":"health","params":{"x":9007199254740993}}', "a6", INT_REASON),
        ('{"type":"req","id":"a7","method":"health","params":{"x":' + "4" * 4301 + "}}", "a7", INT_REASON),
        ('{"type":"req","id":"a8","method":"health","params":{"x":"\\ud800"}}', "a8", SURROGATE_REASON),
        # Nested past what the decoder parses at all: the id is read from the frame's head.
        ('{"type":"req","id":"a9","method":"health","params":' + "[" * 20000 + "]" * 20000 + "}", "a9", DEEP_REASON),
        # Not JSON at all: no id is read.
        (
            '{"type":"req","id":"b1","method":"health","params":{"x":NaN}}',
            "invalid",
            "invalid request frame: malformed JSON (NaN is not a JSON value)",
        ),
    ],
    ids=["issue-frame", "4301-digits", "surrogate", "depth-20000", "nan"],
)
def test_raw_frames_beyond_the_bounds_are_answered_under_their_id(gateway, text, request_id, reason):
    async def scenario():
        client = await _connected_reading_raw(gateway)
        try:
            await client.send_raw(text)
            answer = await _answer(client, request_id)
            await client.send_raw(json.dumps({"type": "req", "id": "after", "method": "health"}))
            after = await _answer(client, "after")
        finally:
            await client.close()
        return answer, after

    answer, after = asyncio.run(scenario())
    assert answer == {
        "type": "res",
        "id": request_id,
        "ok": False,
        "error": {"code": "INVALID_REQUEST", "message": reason},
    }
    assert after["ok"] is True


def test_a_chat_send_over_its_frame_limit_is_refused_under_its_id_and_writes_nothing(gateway):
    key = f"agent:big-{uuid.uuid4().hex[:8]}:main"
    # Not even JSON past its head: only the size is looked at.
    head = '{"type":"req","id":"huge","method":"chat.send","params":{"sessionKey":"' + key + '","message":"'
    text = head + "x" * (MESSAGE_FRAME_BYTES - len(head) + 1)

    async def scenario():
        client = await _connected_reading_raw(gateway)
        before = await sync_to_async(_row_counts)()
        try:
            await client.send_raw(text)
            answer = await _answer(client, "huge")
            await client.send_raw(json.dumps({"type": "req", "id": "after", "method": "health"}))
            after = await _answer(client, "after")
        finally:
            await client.close()
        counts = await sync_to_async(_row_counts)()
        return answer, after, before, counts

    answer, after, before, counts = asyncio.run(scenario())
    assert answer["id"] == "huge"
    assert answer["error"] == {
        "code": "INVALID_REQUEST",
        "message": f"invalid request frame: frame exceeds the limit of chat.send ({MESSAGE_FRAME_BYTES} bytes)",
    }
    assert after["ok"] is True
    assert counts == before


def test_a_message_over_its_character_limit_is_refused_and_writes_nothing(gateway):
    key = f"agent:big-{uuid.uuid4().hex[:8]}:main"

    async def scenario():
        client = operator(gateway)
        await client.connect()
        before = await sync_to_async(_row_counts)()
        try:
            params = {"sessionKey": key, "message": "m" * (MAX_MESSAGE_CHARS + 1), "idempotencyKey": "k"}
            refused = await _refusal_of(client, "chat.send", params)
        finally:
            await client.close()
        counts = await sync_to_async(_row_counts)()
        return refused, before, counts

    refused, before, counts = asyncio.run(scenario())
    assert (refused.code, refused.message) == (
        "INVALID_REQUEST",
        f"invalid chat.send params: at /message: String should have at most {MAX_MESSAGE_CHARS} characters",
    )
    assert counts == before


def test_a_big_frame_reaches_its_handler_before_the_small_frame_sent_after_it(gateway):
    """The big chat.send is decoded and validated off the event loop; the describe written right after it must
    still find the session that chat.send creates (each starts in arrival order on the connection)."""
    key = f"agent:order-{uuid.uuid4().hex[:8]}:main"

    async def scenario():
        client = operator(gateway)
        await client.connect()
        try:
            sent = await client.send_request(
                "chat.send", {"sessionKey": key, "message": "word " * 120_000, "idempotencyKey": "big"}
            )
            described = await client.send_request("sessions.describe", {"key": key})
            return await asyncio.wait_for(sent, 30), await asyncio.wait_for(described, 30)
        finally:
            await client.close()

    sent, described = asyncio.run(scenario())
    assert sent["ok"] is True, sent
    assert sent["payload"]["status"] == "started"
    assert described["ok"] is True, described
    assert described["payload"]["session"]["key"] == key
