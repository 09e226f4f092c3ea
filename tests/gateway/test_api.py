"""The JSON API: token auth, pairing over the same services, errors mapped to HTTP statuses."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client

from devices_app.models import PairedDevice
from devices_app.services import pairing
from gateway.auth import shared_secret_limiter
from gateway.models import AuditLog
from tests.support.api import API_TOKEN

TOKEN = API_TOKEN


@pytest.fixture(autouse=True)
def _token(api_token):
    return api_token


def auth(token: str = TOKEN) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


@pytest.mark.django_db
def test_health_needs_no_token():
    response = Client().get("/api/gateway/health")
    assert response.status_code == 200
    assert response.json()["ok"] is True


@pytest.mark.django_db
def test_other_endpoints_need_the_token():
    client = Client()
    assert client.get("/api/gateway/nodes").status_code == 401
    assert client.get("/api/gateway/nodes", **auth("wrong")).status_code == 401
    assert client.get("/api/gateway/nodes", HTTP_X_OPENCLAW_TOKEN=TOKEN).status_code == 200
    assert client.get("/api/gateway/nodes", **auth()).json()["nodes"] == []


@pytest.mark.django_db
def test_token_guesses_lock_the_address_out_even_for_the_right_token_and_the_socket_too(settings):
    """The JSON API counts wrong tokens per client address in the limiter of the socket's shared-secret connects: one
    token, one guessing budget, whichever door is knocked on."""
    limits = {"MAX_FAILURES": 3, "WINDOW_MS": 60_000, "LOCKOUT_MS": 300_000, "EXEMPT_LOOPBACK": False}
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "AUTH_RATE_LIMIT": limits}
    guesser = f"203.0.113.{uuid.uuid4().int % 250 + 1}"
    other = f"198.51.100.{uuid.uuid4().int % 250 + 1}"
    client = Client(REMOTE_ADDR=guesser)

    wrong = [client.get("/api/gateway/nodes", **auth(f"guess-{n}")) for n in range(2)]
    third = client.get("/api/gateway/nodes", HTTP_X_OPENCLAW_TOKEN="guess-3")
    right = client.get("/api/gateway/nodes", **auth())
    elsewhere = Client(REMOTE_ADDR=other).get("/api/gateway/nodes", **auth())
    no_token = client.get("/api/gateway/nodes")

    assert [response.status_code for response in wrong] == [401, 401]
    for locked in (third, right):
        assert locked.status_code == 429
        assert 290 <= int(locked["Retry-After"]) <= 300
        error = locked.json()["error"]
        assert error["code"] == "INVALID_REQUEST" and error["retryable"] is True
        assert error["message"] == "unauthorized: too many failed authentication attempts (retry later)"
        assert error["details"] == {"code": "AUTH_RATE_LIMITED", "recommendedNextStep": "wait_then_retry"}
    assert elsewhere.status_code == 200
    assert no_token.status_code == 401  # no credential, no guess: answered as before
    assert shared_secret_limiter.check(guesser).locked
    assert not shared_secret_limiter.check(other).locked


@pytest.mark.django_db
def test_pairing_approval_over_http():
    request, _ = pairing.pairing_request_ensure(
        claim=pairing.PairingClaim(
            device_id="a" * 64, public_key="pk", role="node", scopes=[], reason="not-paired", is_repair=False
        )
    )
    client = Client()
    response = client.post(f"/api/gateway/pairing/{request.pk}/approve", **auth())
    assert response.status_code == 200
    assert response.json()["device"]["deviceId"] == "a" * 64
    assert PairedDevice.objects.filter(device_id="a" * 64).exists()
    assert AuditLog.objects.get().actor == "api:token"

    again = client.post(f"/api/gateway/pairing/{request.pk}/approve", **auth())
    assert again.status_code == 404  # no longer open: the same refusal as an unknown request
    assert again.json() == {"error": {"code": "INVALID_REQUEST", "message": "unknown requestId"}}


@pytest.mark.django_db
def test_openapi_schema_is_served():
    response = Client().get("/api/openapi.json")
    assert response.status_code == 200
    assert "/api/gateway/nodes" in response.json()["paths"]


ERROR_SCHEMA = {"$ref": "#/components/schemas/ErrorOut"}


def test_every_operation_is_documented_with_its_errors():
    """Titles, descriptions, stable unique ids, and the one error shape on every error status: 500 always,
    400 where the route takes input, 401 where it needs the token."""
    schema = Client().get("/api/openapi.json").json()
    operations = [(path, verb, op) for path, ops in schema["paths"].items() for verb, op in ops.items()]

    assert len(operations) >= 38
    ids = [op["operationId"] for _, _, op in operations]
    assert len(ids) == len(set(ids))
    for path, verb, op in operations:
        where = f"{verb.upper()} {path}"
        assert op["summary"] and op["description"], where
        assert op["operationId"].isidentifier(), where
        responses = op["responses"]
        documented_errors = {status for status in responses if int(status) >= 400}
        takes_input = bool(op.get("parameters") or op.get("requestBody"))
        always = {"500"} | ({"400"} if takes_input else set()) | ({"401"} if op.get("security") else set())
        assert always <= documented_errors, where
        for status in documented_errors:
            assert responses[status]["content"]["application/json"]["schema"] == ERROR_SCHEMA, (where, status)
        success = [status for status in responses if int(status) < 300]
        assert len(success) == 1, where
    health = schema["paths"]["/api/gateway/health"]["get"]
    assert "security" not in health and "401" not in health["responses"]
    assert schema["paths"]["/api/workers/placements/{key}/dispatch"]["post"]["operationId"] == "placement_dispatch"
