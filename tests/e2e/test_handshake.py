"""Connect handshake over real sockets against a real Daphne gateway process."""

from __future__ import annotations

import asyncio
import json

import pytest

from devices_app.models import DeviceToken, PairedDevice
from gateway.models import GatewayConnection
from openclaw_client.client import ConnectError
from openclaw_client.identity import DeviceIdentity, b64url_encode
from tests.support.clients import ALL_SCOPES, operator, raw_socket, recv_json, signed_connect_params

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_it_completes_the_handshake_and_answers_health(gateway):
    async def scenario():
        client = operator(gateway)
        hello = await client.connect()
        health = await client.request("health")
        await client.close()
        return hello, health

    hello, health = asyncio.run(scenario())
    assert hello["type"] == "hello-ok"
    assert hello["protocol"] == 4
    assert hello["server"]["connId"]
    assert {"health", "status", "node.list", "node.invoke", "device.pair.approve"} <= set(hello["features"]["methods"])
    assert {"connect.challenge", "tick", "presence", "node.invoke.request"} <= set(hello["features"]["events"])
    assert hello["auth"]["role"] == "operator"
    assert hello["auth"]["scopes"] == ALL_SCOPES
    assert hello["auth"]["method"] == "token"
    assert hello["auth"]["deviceToken"]  # a signed operator device gets a device token on first connect
    assert hello["policy"] == {
        "maxPayload": 25 * 1024 * 1024,
        "maxBufferedBytes": 50 * 1024 * 1024,
        "tickIntervalMs": 30000,
    }
    assert set(hello["snapshot"]) >= {"presence", "health", "stateVersion", "uptimeMs"}
    assert health["ok"] is True
    # The operator's device was paired silently by the shared secret; only the token hash is stored.
    device = PairedDevice.objects.get()
    assert device.roles == ["operator"]
    token = DeviceToken.objects.get(device=device)
    assert token.token_hash != hello["auth"]["deviceToken"]
    assert len(token.token_hash) == 64


def test_protocol_3_is_accepted_and_negotiated(gateway):
    async def scenario():
        client = operator(gateway, max_protocol=3)
        hello = await client.connect()
        await client.close()
        return hello

    assert asyncio.run(scenario())["protocol"] == 3


def test_wrong_token_is_refused_with_1008(gateway):
    async def scenario():
        client = operator(gateway, token="not-the-token")
        with pytest.raises(ConnectError) as caught:
            await client.connect()
        return caught.value

    error = asyncio.run(scenario())
    assert error.code == "INVALID_REQUEST"
    assert (
        error.message
        == "unauthorized: gateway token mismatch (use this gateway's gateway.auth.token or pair the device)"
    )
    assert error.details == {
        "code": "AUTH_TOKEN_MISMATCH",
        "authReason": "token_mismatch",
        "canRetryWithDeviceToken": True,
        "recommendedNextStep": "retry_with_device_token",
    }
    assert error.close_code == 1008
    assert error.close_reason == error.message
    assert not GatewayConnection.objects.exists()
    assert not PairedDevice.objects.exists()


def test_no_credentials_and_no_device_needs_a_device_identity(gateway):
    async def scenario():
        client = operator(gateway, token=None, identity=None)
        with pytest.raises(ConnectError) as caught:
            await client.connect()
        return caught.value

    error = asyncio.run(scenario())
    assert (error.code, error.message, error.details) == (
        "NOT_PAIRED",
        "device identity required",
        {"code": "DEVICE_IDENTITY_REQUIRED"},
    )
    assert error.close_code == 1008


def test_protocol_mismatch_closes_with_1002(gateway):
    async def scenario():
        client = operator(gateway, min_protocol=5, max_protocol=6)
        with pytest.raises(ConnectError) as caught:
            await client.connect()
        return caught.value

    error = asyncio.run(scenario())
    assert error.code == "INVALID_REQUEST"
    assert error.message == "protocol mismatch"
    assert error.details == {"code": "PROTOCOL_MISMATCH", "expectedProtocol": 4}
    assert (error.close_code, error.close_reason) == (1002, "protocol mismatch")


def test_invalid_role_is_refused(gateway):
    async def scenario():
        client = operator(gateway, role="superuser")
        with pytest.raises(ConnectError) as caught:
            await client.connect()
        return caught.value

    error = asyncio.run(scenario())
    assert (error.code, error.message, error.close_code) == ("INVALID_REQUEST", "invalid role", 1008)


def _tampered(hook):
    """Connect with valid signed params, then let ``hook`` break one thing."""

    async def scenario(server):
        client = operator(server, identity=DeviceIdentity.generate())
        with pytest.raises(ConnectError) as caught:
            await client.connect(params_hook=hook)
        return caught.value

    return scenario


def _other_key_signature(params):
    params["device"]["signature"] = b64url_encode(b"\x00" * 64)
    return params


def _stale(params):
    params["device"]["signedAt"] -= 3 * 60 * 1000  # skew limit is 2 minutes
    return params


def _wrong_nonce(params):
    params["device"]["nonce"] = "not-this-connections-nonce"
    return params


def _no_nonce(params):
    del params["device"]["nonce"]
    return params


def _wrong_id(params):
    params["device"]["id"] = "0" * 64
    return params


def _short_key(params):
    import hashlib

    raw = b"\x01" * 31
    params["device"]["publicKey"] = b64url_encode(raw)
    params["device"]["id"] = hashlib.sha256(raw).hexdigest()
    return params


@pytest.mark.parametrize(
    ("hook", "message", "code", "reason"),
    [
        (_other_key_signature, "device signature invalid", "DEVICE_AUTH_SIGNATURE_INVALID", "device-signature"),
        (_stale, "device signature expired", "DEVICE_AUTH_SIGNATURE_EXPIRED", "device-signature-stale"),
        (_wrong_nonce, "device nonce mismatch", "DEVICE_AUTH_NONCE_MISMATCH", "device-nonce-mismatch"),
        (_no_nonce, "device nonce required", "DEVICE_AUTH_NONCE_REQUIRED", "device-nonce-missing"),
        (_wrong_id, "device identity mismatch", "DEVICE_AUTH_DEVICE_ID_MISMATCH", "device-id-mismatch"),
        (_short_key, "device public key invalid", "DEVICE_AUTH_PUBLIC_KEY_INVALID", "device-public-key"),
    ],
)
def test_bad_device_proof_is_refused_with_the_exact_message(gateway, hook, message, code, reason):
    error = asyncio.run(_tampered(hook)(gateway))
    assert error.code == "INVALID_REQUEST"
    assert error.message == message
    assert error.details == {"code": code, "reason": reason}
    assert (error.close_code, error.close_reason) == (1008, message)
    assert not PairedDevice.objects.exists()
    assert not GatewayConnection.objects.exists()


def test_v2_signatures_are_accepted(gateway):
    async def scenario():
        client = operator(gateway, identity=DeviceIdentity.generate(), payload_version="v2")
        hello = await client.connect()
        await client.close()
        return hello

    assert asyncio.run(scenario())["auth"]["role"] == "operator"


def test_signature_over_another_connections_nonce_is_refused(gateway):
    """A captured connect cannot be replayed on a new connection: the nonce is bound to it."""

    async def scenario():
        identity = DeviceIdentity.generate()
        first, first_nonce = await raw_socket(gateway)
        second, _second_nonce = await raw_socket(gateway)
        params = signed_connect_params(identity, first_nonce, token=gateway.token)
        await second.send(json.dumps({"type": "req", "id": "c1", "method": "connect", "params": params}))
        response = await recv_json(second)
        await first.close()
        await second.wait_closed()
        return response, second.close_code

    response, close_code = asyncio.run(scenario())
    assert response["error"]["message"] == "device nonce mismatch"
    assert close_code == 1008


def test_first_frame_must_be_connect(gateway):
    async def scenario():
        ws, _nonce = await raw_socket(gateway)
        await ws.send(json.dumps({"type": "req", "id": "r1", "method": "health", "params": {}}))
        response = await recv_json(ws)
        await ws.wait_closed()
        return response, ws.close_code

    response, close_code = asyncio.run(scenario())
    assert response == {
        "type": "res",
        "id": "r1",
        "ok": False,
        "error": {"code": "INVALID_REQUEST", "message": "invalid handshake: first request must be connect"},
    }
    assert close_code == 1008


def test_a_first_frame_that_is_not_a_request_closes_without_answer(gateway):
    async def scenario():
        ws, _nonce = await raw_socket(gateway)
        await ws.send("this is not json")
        await ws.wait_closed()
        return ws.close_code, ws.close_reason

    assert asyncio.run(scenario()) == (1008, "invalid request frame")


def test_invalid_connect_params_are_described(gateway):
    async def scenario():
        ws, _nonce = await raw_socket(gateway)
        params = {
            "minProtocol": 3,
            "maxProtocol": 4,
            "client": {"id": "cli", "version": "1", "platform": "x", "mode": "cli"},
            "bogus": 1,
        }
        await ws.send(json.dumps({"type": "req", "id": "c", "method": "connect", "params": params}))
        response = await recv_json(ws)
        await ws.wait_closed()
        return response, ws.close_code

    response, close_code = asyncio.run(scenario())
    assert response["error"]["message"] == "invalid connect params: at /bogus: unexpected property"
    assert close_code == 1008


def test_preauth_frames_over_64_kib_close_the_socket(gateway):
    async def scenario():
        ws, _nonce = await raw_socket(gateway)
        await ws.send(json.dumps({"type": "req", "id": "c", "method": "connect", "params": {"pad": "x" * 70_000}}))
        await ws.wait_closed()
        return ws.close_code

    assert asyncio.run(scenario()) == 1009


def test_handshake_timeout_closes_an_idle_socket(gateway_factory):
    server = gateway_factory(extra_env={"OPENCLAW_HANDSHAKE_TIMEOUT_MS": "300"})

    async def scenario():
        ws, _nonce = await raw_socket(server)
        await asyncio.wait_for(ws.wait_closed(), 10)
        return ws.close_code, ws.close_reason

    assert asyncio.run(scenario()) == (1000, "handshake timeout")


def test_the_ws_path_serves_the_same_protocol(gateway):
    async def scenario():
        client = operator(gateway, url=f"{gateway.url}/ws")
        hello = await client.connect()
        await client.close()
        return hello

    assert asyncio.run(scenario())["type"] == "hello-ok"


def test_password_auth(gateway_factory):
    server = gateway_factory(extra_env={"OPENCLAW_GATEWAY_PASSWORD": "correct horse"})

    async def scenario():
        ok = operator(server, token=None, password="correct horse")
        hello = await ok.connect()
        await ok.close()
        wrong = operator(
            server, token=None, password="battery staple", client_id="gateway-client", client_mode="backend"
        )
        with pytest.raises(ConnectError) as refused:
            await wrong.connect()
        return hello, refused.value

    hello, refused = asyncio.run(scenario())
    assert hello["auth"]["method"] == "password"
    assert refused.message == "unauthorized: gateway password mismatch (provide gateway auth password)"
    assert refused.details["code"] == "AUTH_PASSWORD_MISMATCH"


def test_an_operator_reconnects_with_its_device_token_alone(gateway, tmp_path):
    async def scenario():
        first = operator(gateway, identity=None, state_dir=str(tmp_path), scopes=["operator.read"])
        hello = await first.connect()
        await first.close()
        again = operator(gateway, identity=None, state_dir=str(tmp_path), token=None, scopes=["operator.read"])
        hello_again = await again.connect()
        status = await again.request("status")
        await again.close()
        wider = operator(
            gateway, identity=None, state_dir=str(tmp_path), token=None, scopes=["operator.read", "operator.write"]
        )
        with pytest.raises(ConnectError) as refused:
            await wider.connect()
        return hello, hello_again, status, refused.value

    hello, hello_again, status, refused = asyncio.run(scenario())
    assert hello["auth"]["deviceToken"]
    assert hello_again["auth"]["method"] == "device-token"
    assert hello_again["auth"]["scopes"] == ["operator.read"]
    assert status["runtimeVersion"]
    assert refused.message == "unauthorized: device token scope mismatch (re-pair or approve scope upgrade)"
    assert refused.details["code"] == "AUTH_SCOPE_MISMATCH"
