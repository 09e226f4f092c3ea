"""Frames at and beyond the protocol's limits, over real sockets against a real gateway process.

Every refusal is an answer (``INVALID_REQUEST``, the connection stays usable) or, before the
handshake, a 1008 close with a reason; nothing is written; a connection never goes silent.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import time

import pytest
import websockets
from channels.db import database_sync_to_async as sync_to_async
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from devices_app.models import DevicePairingRequest, DeviceToken, PairedDevice
from gateway.models import AuditLog, GatewayConnection
from gateway.protocol import MAX_JSON_DEPTH, MAX_SAFE_INTEGER
from openclaw_client.client import GatewayError
from openclaw_client.identity import DeviceIdentity, b64_decode_any, b64url_encode, build_device_auth_payload
from sessions_app.models import Run, Session, TranscriptEvent
from tests.support.clients import ALL_SCOPES, operator, paired_node, raw_socket, recv_json, signed_connect_params

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SURROGATE_ID = '{"type":"req","id":"\\ud800","method":"health"}'
TOO_DEEP = "[" * 20000 + "]" * 20000
HUGE_INT = "4" * 4301
DEEP_REASON = f"invalid request frame: nested deeper than {MAX_JSON_DEPTH} levels"
INT_REASON = f"invalid request frame: integer out of range (must be within ±{MAX_SAFE_INTEGER})"
SURROGATE_REASON = "invalid request frame: lone surrogate in a string (not valid UTF-8 text)"


def _row_counts() -> dict[str, int]:
    models = (AuditLog, DevicePairingRequest, DeviceToken, PairedDevice, Session, Run, TranscriptEvent)
    return {model.__name__: model.objects.count() for model in models}


async def _connected(server, **kwargs):
    client = operator(server, **kwargs)
    await client.connect()
    # Read frames here instead of the client's reader task.
    client._reader.cancel()
    return client


async def _next_response(client) -> dict:
    while True:
        frame = json.loads(await asyncio.wait_for(client._ws.recv(), 10))
        if frame.get("type") == "res":
            return frame


async def _send_and_read(client, data: str) -> dict:
    await client.send_raw(data)
    return await _next_response(client)


async def _still_answers(client) -> bool:
    response = await _send_and_read(client, json.dumps({"type": "req", "id": "after", "method": "health"}))
    return response["id"] == "after" and response["ok"] is True


def _req(method: str, params: dict, request_id: str = "r1") -> str:
    return json.dumps({"type": "req", "id": request_id, "method": method, "params": params})


# --- after the handshake: answered, and the connection keeps answering ----------------------------


@pytest.mark.parametrize(
    ("data", "expected_id", "message"),
    [
        # The id itself is the lone surrogate: no answer can carry it back.
        (SURROGATE_ID, "invalid", SURROGATE_REASON),
        ('{"type":"req","id":"r","method":"sessions.list","params":{"search":"\\udc00"}}', "r", SURROGATE_REASON),
        ('{"type":"req","id":"r","method":"health","params":{"\\ud83d":1}}', "r", SURROGATE_REASON),
        (TOO_DEEP, "invalid", DEEP_REASON),
        (_req("sessions.list", {"search": "x"}).replace('"x"', "[" * 100 + "]" * 100), "r1", DEEP_REASON),
        (_req("sessions.list", {}).replace("{}", '{"limit": ' + HUGE_INT + "}"), "r1", INT_REASON),
        (_req("sessions.list", {}).replace("{}", '{"offset": ' + "7" * 401 + "}"), "r1", INT_REASON),
        (
            _req("agent.wait", {"runId": "x"}).replace('"x"}', '"x", "timeoutMs": 1e999}'),
            "r1",
            "invalid request frame: number out of range (must be finite)",
        ),
        # Not JSON at all: its id is not read.
        (
            _req("health", {}).replace("{}", '{"x": NaN}'),
            "invalid",
            "invalid request frame: malformed JSON (NaN is not a JSON value)",
        ),
    ],
    ids=[
        "surrogate-id",
        "surrogate-param",
        "surrogate-key",
        "deep-frame",
        "deep-params",
        "4301-digits",
        "401-digits",
        "infinite",
        "nan",
    ],
)
def test_frames_beyond_the_limits_are_answered_and_the_socket_stays_usable(gateway, data, expected_id, message):
    async def scenario():
        client = await _connected(gateway)
        before = await sync_to_async(_row_counts)()
        response = await _send_and_read(client, data)
        alive = await _still_answers(client)
        after = await sync_to_async(_row_counts)()
        await client.close()
        return response, alive, before, after

    response, alive, before, after = asyncio.run(scenario())
    assert response == {
        "type": "res",
        "id": expected_id,
        "ok": False,
        "error": {"code": "INVALID_REQUEST", "message": message},
    }
    assert alive
    assert after == before


def test_a_node_invoke_payload_with_a_lone_surrogate_never_silences_a_connection(gateway):
    """The node's payloadJSON is refused at the node; the caller is answered at once, not at its timeout."""

    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        worker = await paired_node(gateway, admin, invoke_handler=None)
        invoke = asyncio.create_task(
            admin.request(
                "node.invoke",
                {"nodeId": worker.device_id, "command": "echo", "params": {}, "idempotencyKey": "k"},
                timeout=20,
            )
        )
        request = (await worker.next_event("node.invoke.request"))["payload"]
        with pytest.raises(GatewayError) as refused_at_node:
            await worker.request(
                "node.invoke.result",
                {"id": request["id"], "nodeId": worker.device_id, "ok": True, "payloadJSON": '{"x": "\\ud800"}'},
                timeout=10,
            )
        with pytest.raises(GatewayError) as failed_for_caller:
            await invoke
        # The operator's own frame with a surrogate in node.invoke params is refused at parse time.
        await admin.send_raw(
            '{"type":"req","id":"i2","method":"node.invoke","params":{"nodeId":"n","command":"echo",'
            '"params":{"text":"\\udfff"},"idempotencyKey":"k2"}}'
        )
        after_admin = await admin.request("health", timeout=10)
        after_node = await worker.request("health", timeout=10)
        await worker.close()
        await admin.close()
        return refused_at_node.value, failed_for_caller.value, after_admin, after_node

    refused_at_node, failed, after_admin, after_node = asyncio.run(scenario())
    assert refused_at_node.code == "INVALID_REQUEST"
    assert refused_at_node.message == (
        "invalid node.invoke.result params: payloadJSON: lone surrogate in a string (not valid UTF-8 text)"
    )
    assert failed.code == "UNAVAILABLE"
    assert failed.message == "invalid payloadJSON: lone surrogate in a string (not valid UTF-8 text)"
    assert failed.details["nodeError"]["code"] == "INVALID_REQUEST"
    assert after_admin["ok"] is True and after_node["ok"] is True


# --- params of the apps' methods: refused, nothing written, on every database alike ---------------


@pytest.mark.parametrize(
    ("method", "params", "message"),
    [
        (
            "sessions.create",
            {"label": "a\x00b"},
            "invalid sessions.create params: at /label: must not contain NUL characters",
        ),
        (
            "sessions.create",
            {"key": "k\x00"},
            "invalid sessions.create params: at /key: must not contain NUL characters",
        ),
        ("agent.wait", {"runId": "\x00"}, "invalid agent.wait params: at /runId: must not contain NUL characters"),
        (
            "device.pair.remove",
            {"deviceId": "d\x00"},
            "invalid device.pair.remove params: at /deviceId: must not contain NUL characters",
        ),
        (
            "device.token.revoke",
            {"deviceId": "d", "role": "operator\x00"},
            "invalid device.token.revoke params: at /role: must not contain NUL characters",
        ),
        ("sessions.list", {"offset": 2**60}, INT_REASON),
    ],
    ids=["label-nul", "key-nul", "runid-nul", "pair-remove-nul", "token-revoke-nul", "offset-2^60"],
)
def test_text_and_integers_storage_cannot_take_are_refused_before_any_write(gateway, method, params, message):
    async def scenario():
        client = await _connected(gateway)
        before = await sync_to_async(_row_counts)()
        response = await _send_and_read(client, _req(method, params))
        alive = await _still_answers(client)
        after = await sync_to_async(_row_counts)()
        await client.close()
        return response, alive, before, after

    response, alive, before, after = asyncio.run(scenario())
    assert response["ok"] is False
    assert response["error"] == {"code": "INVALID_REQUEST", "message": message}
    assert alive
    assert after == before


def test_sessions_create_with_lone_surrogates_in_the_key_is_refused(gateway):
    async def scenario():
        client = await _connected(gateway)
        response = await _send_and_read(
            client, '{"type":"req","id":"c","method":"sessions.create","params":{"key":"\\udc00\\ud800"}}'
        )
        alive = await _still_answers(client)
        await client.close()
        return response, alive

    response, alive = asyncio.run(scenario())
    assert response["error"] == {"code": "INVALID_REQUEST", "message": SURROGATE_REASON}
    assert alive
    assert not Session.objects.exists()


def test_the_largest_safe_offset_is_a_valid_page(gateway):
    async def scenario():
        client = operator(gateway)
        await client.connect()
        listed = await client.request("sessions.list", {"offset": MAX_SAFE_INTEGER})
        await client.close()
        return listed

    assert asyncio.run(scenario())["sessions"] == []


# --- before the handshake: a 1008 close with a reason ------------------------------------------


def _connect_frame(params: dict) -> str:
    return json.dumps({"type": "req", "id": "c1", "method": "connect", "params": params})


BASE_CONNECT = {
    "minProtocol": 3,
    "maxProtocol": 4,
    "client": {"id": "cli", "version": "1", "platform": "linux", "mode": "cli"},
    "auth": {"token": "placeholder"},
}


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ('{"type":"req","id":"\\ud800","method":"connect","params":{}}', SURROGATE_REASON),
        (TOO_DEEP, DEEP_REASON),
        (_connect_frame(BASE_CONNECT).replace('"minProtocol": 3', '"minProtocol": ' + HUGE_INT), INT_REASON),
        (_connect_frame(BASE_CONNECT).replace('"maxProtocol": 4', f'"maxProtocol": {2**64}'), INT_REASON),
        (_connect_frame({**BASE_CONNECT, "caps": "X"}).replace('"X"', "[" * 80 + "]" * 80), DEEP_REASON),
        (_connect_frame(BASE_CONNECT).replace('"linux"', '"\\udfff"'), SURROGATE_REASON),
        ("{not json", "invalid request frame"),
    ],
    ids=["surrogate-id", "deep", "4301-digits", "2^64", "deep-params", "surrogate-param", "not-json"],
)
def test_preauth_frames_beyond_the_limits_close_with_1008_and_a_reason(gateway, data, reason):
    async def scenario():
        ws, _nonce = await raw_socket(gateway)
        await ws.send(data)
        await asyncio.wait_for(ws.wait_closed(), 10)
        return ws.close_code, ws.close_reason

    assert asyncio.run(scenario()) == (1008, reason)
    assert not GatewayConnection.objects.exists()


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"minProtocol": "4"}, "invalid connect params: at /minProtocol: Input should be a valid integer"),
        ({"maxProtocol": True}, "invalid connect params: at /maxProtocol: Input should be a valid integer"),
        ({"role": ""}, "invalid connect params: at /role: String should have at least 1 character"),
        (
            {"client": {**BASE_CONNECT["client"], "version": "\x00"}},
            "invalid connect params: at /client/version: must not contain NUL characters",
        ),
        (
            {"permissions": {"camera": "yes"}},
            "invalid connect params: at /permissions/camera: Input should be a valid boolean",
        ),
        (
            {"permissions": {"": True}},
            "invalid connect params: at /permissions//[key]: String should have at least 1 character",
        ),
        ({"caps": [""]}, "invalid connect params: at /caps/0: String should have at least 1 character"),
        ({"role": "admin"}, "invalid role"),
    ],
    ids=[
        "min-as-string",
        "max-as-bool",
        "empty-role",
        "nul-version",
        "permission-not-bool",
        "empty-permission",
        "empty-cap",
        "unknown-role",
    ],
)
def test_connect_is_a_closed_strict_object(gateway, patch, message):
    async def scenario():
        ws, _nonce = await raw_socket(gateway)
        await ws.send(_connect_frame({**BASE_CONNECT, "auth": {"token": gateway.token}, **patch}))
        response = await recv_json(ws)
        await asyncio.wait_for(ws.wait_closed(), 10)
        return response, ws.close_code, ws.close_reason

    response, close_code, close_reason = asyncio.run(scenario())
    assert response == {
        "type": "res",
        "id": "c1",
        "ok": False,
        "error": {"code": "INVALID_REQUEST", "message": message},
    }
    assert (close_code, close_reason) == (1008, message)
    assert not GatewayConnection.objects.exists()
    assert not PairedDevice.objects.exists()


# --- weak Ed25519 keys ----------------------------------------------------------------------------

IDENTITY_POINT = bytes.fromhex("01" + "00" * 31)
ED25519_ORDER = 2**252 + 27742317777372353535851937790883648493


def _weak_key_connect(nonce: str, token: str, public_key: bytes) -> dict:
    """Connect params for a key nobody holds the private key of, with a forged signature R = small order, S = 0.

    ``signedAt`` is varied until ``cryptography`` alone accepts the forgery (always at once for the
    identity; about one try in four for the all-zero key), so the refusal can only come from the gateway.
    """
    device_id = hashlib.sha256(public_key).hexdigest()
    key = Ed25519PublicKey.from_public_bytes(public_key)
    now = int(time.time() * 1000)
    small_order_r = [IDENTITY_POINT, bytes(32), bytes.fromhex("ec" + "ff" * 30 + "7f")]
    for signed_at in range(now, now + 200):
        payload = build_device_auth_payload(
            version="v3",
            device_id=device_id,
            client_id="cli",
            client_mode="cli",
            role="operator",
            scopes=ALL_SCOPES,
            signed_at_ms=signed_at,
            token=token,
            nonce=nonce,
            platform="linux",
        )
        for r in small_order_r:
            signature = r + bytes(32)
            try:
                key.verify(signature, payload.encode())
            except InvalidSignature:
                continue
            return {
                "minProtocol": 3,
                "maxProtocol": 4,
                "client": {"id": "cli", "version": "test/1", "platform": "linux", "mode": "cli"},
                "role": "operator",
                "scopes": ALL_SCOPES,
                "auth": {"token": token},
                "device": {
                    "id": device_id,
                    "publicKey": b64url_encode(public_key),
                    "signature": b64url_encode(signature),
                    "signedAt": signed_at,
                    "nonce": nonce,
                },
            }
    raise AssertionError("no forgery found")


@pytest.mark.parametrize("public_key", [IDENTITY_POINT, bytes(32)], ids=["identity", "all-zero"])
def test_small_order_device_keys_are_refused(gateway, public_key):
    async def scenario():
        ws, nonce = await raw_socket(gateway)
        await ws.send(_connect_frame(_weak_key_connect(nonce, gateway.token, public_key)))
        response = await recv_json(ws)
        await asyncio.wait_for(ws.wait_closed(), 10)
        return response, ws.close_code

    response, close_code = asyncio.run(scenario())
    assert response["error"] == {
        "code": "INVALID_REQUEST",
        "message": "device public key invalid",
        "details": {"code": "DEVICE_AUTH_PUBLIC_KEY_INVALID", "reason": "device-public-key"},
    }
    assert close_code == 1008
    assert not PairedDevice.objects.exists()
    assert not DeviceToken.objects.exists()


def test_a_signature_with_s_not_reduced_is_refused(gateway):
    async def scenario():
        identity = DeviceIdentity.generate()
        ws, nonce = await raw_socket(gateway)
        params = signed_connect_params(identity, nonce, token=gateway.token)
        raw = b64_decode_any(params["device"]["signature"])
        s = int.from_bytes(raw[32:], "little") + ED25519_ORDER
        params["device"]["signature"] = b64url_encode(raw[:32] + s.to_bytes(32, "little"))
        await ws.send(_connect_frame(params))
        response = await recv_json(ws)
        await asyncio.wait_for(ws.wait_closed(), 10)
        return response, ws.close_code

    response, close_code = asyncio.run(scenario())
    assert response["error"]["message"] == "device signature invalid"
    assert close_code == 1008
    assert not PairedDevice.objects.exists()


# --- device-less operators: scopes cleared except in OpenClaw's loopback bypasses -----------------


async def _deviceless_hello(server, *, client_id: str, mode: str, headers: dict | None = None, url: str | None = None):
    ws = await websockets.connect(url or server.url, additional_headers=headers or {})
    await recv_json(ws)  # connect.challenge
    params = {
        "minProtocol": 3,
        "maxProtocol": 4,
        "client": {"id": client_id, "version": "test/1", "platform": "linux", "mode": mode},
        "role": "operator",
        "scopes": ALL_SCOPES,
        "auth": {"token": server.token},
    }
    await ws.send(_connect_frame(params))
    hello = await recv_json(ws)
    assert hello["ok"] is True, hello
    await ws.send(json.dumps({"type": "req", "id": "n", "method": "node.list"}))
    while True:
        listed = await recv_json(ws)
        if listed.get("type") == "res":
            break
    await ws.close()
    return hello["payload"]["auth"], listed


MISSING_READ = {"code": "INVALID_REQUEST", "message": "missing scope: operator.read"}


@pytest.mark.parametrize(
    ("client_id", "mode", "headers", "kept"),
    [
        ("gateway-client", "backend", None, True),
        ("cli", "cli", None, True),
        ("test", "test", None, False),
        ("openclaw-tui", "ui", None, False),
        ("gateway-client", "cli", None, False),
        ("cli", "cli", {"X-Forwarded-For": "203.0.113.9"}, False),
        ("gateway-client", "backend", {"Forwarded": "for=203.0.113.9"}, False),
        ("gateway-client", "backend", {"X-Real-IP": "203.0.113.9"}, False),
        ("gateway-client", "backend", {"Origin": "http://127.0.0.1:3000"}, False),
    ],
    ids=[
        "backend",
        "cli",
        "test-client",
        "tui",
        "gateway-client-not-backend",
        "cli-behind-proxy",
        "backend-forwarded",
        "backend-real-ip",
        "backend-from-a-browser",
    ],
)
def test_deviceless_shared_token_operators_keep_scopes_only_in_the_loopback_bypasses(
    gateway, client_id, mode, headers, kept
):
    auth, listed = asyncio.run(_deviceless_hello(gateway, client_id=client_id, mode=mode, headers=headers))
    assert auth["role"] == "operator" and auth["method"] == "token"
    assert "deviceToken" not in auth
    if kept:
        assert auth["scopes"] == ALL_SCOPES
        assert listed["ok"] is True
    else:
        assert auth["scopes"] == []
        assert listed["ok"] is False and listed["error"]["message"] == MISSING_READ["message"]
    assert not PairedDevice.objects.exists()


def _non_loopback_address() -> str | None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


def test_a_deviceless_backend_client_from_another_address_gets_no_scopes(gateway_factory):
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    server = gateway_factory(extra_env={"OPENCLAW_GATEWAY_BIND": "0.0.0.0"})
    auth, listed = asyncio.run(
        _deviceless_hello(server, client_id="gateway-client", mode="backend", url=f"ws://{address}:{server.port}")
    )
    assert auth["scopes"] == []
    assert listed["error"]["message"] == MISSING_READ["message"]


def test_a_deviceless_backend_client_with_the_password_keeps_its_scopes(gateway_factory):
    server = gateway_factory(extra_env={"OPENCLAW_GATEWAY_PASSWORD": "correct horse"})

    async def scenario():
        backend = operator(server, token=None, password="correct horse", identity=None)
        backend.options.client_id, backend.options.client_mode = "gateway-client", "backend"
        hello = await backend.connect()
        listed = await backend.request("node.list")
        await backend.close()
        other = operator(server, token=None, password="correct horse", identity=None)
        other.options.client_id, other.options.client_mode = "test", "test"
        other_hello = await other.connect()
        await other.close()
        return hello, listed, other_hello

    hello, listed, other_hello = asyncio.run(scenario())
    assert hello["auth"]["scopes"] == ALL_SCOPES and hello["auth"]["method"] == "password"
    assert listed["nodes"] == []
    assert other_hello["auth"]["scopes"] == []


def test_a_node_without_a_device_is_still_refused(gateway):
    async def scenario():
        ws = await websockets.connect(gateway.url)
        await recv_json(ws)
        params = {
            "minProtocol": 3,
            "maxProtocol": 4,
            "client": {"id": "gateway-client", "version": "1", "platform": "linux", "mode": "backend"},
            "role": "node",
            "auth": {"token": gateway.token},
        }
        await ws.send(_connect_frame(params))
        response = await recv_json(ws)
        await asyncio.wait_for(ws.wait_closed(), 10)
        return response

    response = asyncio.run(scenario())
    assert response["error"]["code"] == "NOT_PAIRED"
    assert response["error"]["message"] == "device identity required"
