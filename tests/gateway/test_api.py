"""The JSON API: token auth, pairing over the same services, errors mapped to HTTP statuses."""

from __future__ import annotations

import pytest
from django.test import Client

from openclaw_site.gateway.models import AuditLog, PairedDevice
from openclaw_site.gateway.services import pairing
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
