"""The pairing, device and device-token JSON API, full stack: the device.pair.* / device.token.* services
and payloads, and every refusal with its status, exact message and no change (:func:`refused`)."""

from __future__ import annotations

import pytest
from django.test import Client

from devices_app import rpc as device_rpc
from devices_app import selectors as device_selectors
from devices_app.models import DevicePairingRequest, DeviceToken, PairedDevice, PairingStatus
from gateway import scopes as sc
from gateway.models import AuditLog
from gateway.schemas import MAX_SCOPES
from tests.support.api import API_TOKEN
from tests.support.connections import admin_operator_context
from tests.support.operators import operator_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _token(api_token):
    return api_token


@pytest.fixture
def client() -> Client:
    return Client(headers={"Authorization": f"Bearer {API_TOKEN}"})


def world() -> dict:
    """Everything a pairing or token operation may change."""
    return {
        "devices": list(PairedDevice.objects.order_by("pk").values()),
        "tokens": list(DeviceToken.objects.order_by("pk").values()),
        "requests": list(DevicePairingRequest.objects.order_by("pk").values()),
        "audit": AuditLog.objects.count(),
    }


def refused(response, status: int, message: str, *, before: dict) -> None:
    assert response.status_code == status, response.content
    assert response.json()["error"]["code"] == "INVALID_REQUEST"
    assert response.json()["error"]["message"] == message
    assert world() == before


def post(client: Client, url: str, body: dict | None = None):
    return client.post(url, body or {}, content_type="application/json")


def device_id(n: int) -> str:
    return f"{n:064x}"


def test_every_route_needs_the_gateway_token(make_pairing_request, make_device, make_token):
    request = make_pairing_request(1)
    device = make_device(2)
    make_token(device)
    before = world()
    routes = [
        ("get", "/api/gateway/pairing/requests"),
        ("post", f"/api/gateway/pairing/{request.pk}/approve"),
        ("post", f"/api/gateway/pairing/{request.pk}/reject"),
        ("get", "/api/gateway/devices"),
        ("delete", f"/api/gateway/devices/{device.device_id}"),
        ("post", f"/api/gateway/devices/{device.device_id}/tokens/operator/rotate"),
        ("post", f"/api/gateway/devices/{device.device_id}/tokens/operator/revoke"),
    ]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-OpenClaw-Token": "wrong"}):
        for verb, url in routes:
            response = getattr(Client(headers=headers), verb)(url, content_type="application/json")
            assert response.status_code == 401, (verb, url)
    assert world() == before


# --- open requests -----------------------------------------------------------------------------------


def test_open_requests_of_every_role_newest_first_or_of_one(client, make_pairing_request):
    operator = make_pairing_request(1)
    node = make_pairing_request(2, role=sc.ROLE_NODE, scopes=[])

    every = client.get("/api/gateway/pairing/requests").json()["pending"]
    nodes = client.get("/api/gateway/pairing/requests", {"role": "node"}).json()["pending"]
    operators = client.get("/api/gateway/pairing/requests", {"role": "operator"}).json()["pending"]

    assert [r["requestId"] for r in every] == [str(node.pk), str(operator.pk)]
    assert every == device_selectors.device_pair_list()["pending"]
    assert [r["requestId"] for r in nodes] == [str(node.pk)]
    assert [r["requestId"] for r in operators] == [str(operator.pk)]
    assert every[1]["displayName"] == "Laptop 1" and every[1]["scopes"] == [sc.READ, sc.WRITE]


def test_an_unknown_role_filter_is_refused(client):
    response = client.get("/api/gateway/pairing/requests", {"role": "admin"})

    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("invalid request: at /role (query):")


# --- approve and reject (device.pair.*) ---------------------------------------------------------------


def test_approve_pairs_the_device_as_device_pair_approve_does(client, make_pairing_request):
    request = make_pairing_request(1)

    response = post(client, f"/api/gateway/pairing/{request.pk}/approve")

    assert response.status_code == 200
    device = PairedDevice.objects.get(device_id=device_id(1))
    assert response.json() == {
        "requestId": str(request.pk),
        "device": device_selectors.paired_device_shape(device, connected=False),
    }
    assert (device.roles, device.approved_scopes) == ([sc.ROLE_OPERATOR], [sc.READ, sc.WRITE])
    assert DevicePairingRequest.objects.get(pk=request.pk).status == PairingStatus.APPROVED
    assert AuditLog.objects.get(action="device.pair.approve").actor == "api:token"


def test_a_request_decided_meanwhile_is_not_found_and_nothing_changes(client, make_pairing_request):
    request = make_pairing_request(1)
    post(client, f"/api/gateway/pairing/{request.pk}/reject")
    before = world()

    refused(post(client, f"/api/gateway/pairing/{request.pk}/approve"), 404, "unknown requestId", before=before)
    refused(post(client, f"/api/gateway/pairing/{request.pk}/reject"), 404, "unknown requestId", before=before)


@pytest.mark.parametrize("request_id", ["6f1c2d3e-0000-4000-8000-000000000000", "not-a-uuid"])
def test_an_unknown_request_is_not_found(client, make_pairing_request, request_id):
    make_pairing_request(1)
    before = world()

    refused(post(client, f"/api/gateway/pairing/{request_id}/approve"), 404, "unknown requestId", before=before)
    refused(post(client, f"/api/gateway/pairing/{request_id}/reject"), 404, "unknown requestId", before=before)


def test_an_overlong_request_id_is_bad_input(client):
    before = world()

    response = post(client, f"/api/gateway/pairing/{'r' * 201}/approve")

    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("invalid request: at /requestId (path):")
    assert world() == before


def test_reject_closes_the_request(client, make_pairing_request):
    request = make_pairing_request(1)

    response = post(client, f"/api/gateway/pairing/{request.pk}/reject")

    assert response.status_code == 200
    assert response.json() == {"requestId": str(request.pk), "deviceId": device_id(1)}
    assert DevicePairingRequest.objects.get(pk=request.pk).status == PairingStatus.REJECTED
    assert not PairedDevice.objects.exists()


# --- node requests (node.pair.*) ----------------------------------------------------------------------


def test_node_pairing_lists_approves_and_rejects_only_node_requests(client, make_pairing_request):
    node = make_pairing_request(1, role=sc.ROLE_NODE, scopes=[])
    other_node = make_pairing_request(2, role=sc.ROLE_NODE, scopes=[])
    operator = make_pairing_request(3)

    listed = client.get("/api/gateway/nodes/pairing").json()
    assert listed == device_rpc.node_pair_list_rpc(admin_operator_context(), None)
    assert {r["requestId"] for r in listed["pending"]} == {str(node.pk), str(other_node.pk)}

    before = world()
    refused(post(client, f"/api/gateway/nodes/pairing/{operator.pk}/approve"), 404, "unknown requestId", before=before)
    refused(post(client, f"/api/gateway/nodes/pairing/{operator.pk}/reject"), 404, "unknown requestId", before=before)

    approved = post(client, f"/api/gateway/nodes/pairing/{node.pk}/approve")
    assert approved.status_code == 200
    device = PairedDevice.objects.get(device_id=device_id(1))
    assert approved.json() == {"requestId": str(node.pk), "node": device_selectors.paired_node_shape(device)}
    assert device.is_node

    rejected = post(client, f"/api/gateway/nodes/pairing/{other_node.pk}/reject")
    assert rejected.json() == {"requestId": str(other_node.pk), "nodeId": device_id(2)}
    assert client.get("/api/gateway/nodes/pairing").json()["paired"][0]["nodeId"] == device_id(1)


# --- paired devices (device.pair.list / remove) ---------------------------------------------------------


def test_devices_are_the_device_pair_list_payload(client, make_pairing_request, make_device, make_token):
    make_pairing_request(1)
    make_token(make_device(2))

    response = client.get("/api/gateway/devices")

    assert response.status_code == 200
    assert response.json() == device_rpc.device_pair_list_rpc(admin_operator_context(), None)
    paired = response.json()["paired"][0]
    assert (paired["deviceId"], paired["connected"], [t["role"] for t in paired["tokens"]]) == (
        device_id(2),
        False,
        [sc.ROLE_OPERATOR],
    )


def test_removing_a_device_forgets_it_and_its_tokens(client, make_device, make_token):
    make_token(make_device(1))

    response = client.delete(f"/api/gateway/devices/{device_id(1)}")

    assert (response.status_code, response.json()) == (200, {"deviceId": device_id(1)})
    assert not PairedDevice.objects.exists() and not DeviceToken.objects.exists()
    assert AuditLog.objects.get(action="device.pair.remove").actor == "api:token"
    refused(client.delete(f"/api/gateway/devices/{device_id(1)}"), 404, "unknown deviceId", before=world())


# --- device tokens ------------------------------------------------------------------------------------


def test_rotation_issues_a_new_token_and_withholds_it_from_another_caller(client, make_device, make_token):
    device = make_device(1)
    old = make_token(device)

    response = post(client, f"/api/gateway/devices/{device.device_id}/tokens/operator/rotate", {"scopes": [sc.READ]})

    assert response.status_code == 200
    body = response.json()
    assert "token" not in body
    assert (body["deviceId"], body["role"], body["scopes"], body["tokenDelivery"]) == (
        device.device_id,
        sc.ROLE_OPERATOR,
        [sc.READ],
        "withheld-cross-device",
    )
    assert DeviceToken.objects.get(pk=old.pk).token_hash != old.token_hash
    # Without a body: the device's approved scopes.
    again = post(client, f"/api/gateway/devices/{device.device_id}/tokens/operator/rotate")
    assert again.json()["scopes"] == [sc.READ, sc.WRITE]


def test_rotation_refusals_change_nothing(client, make_device, make_token):
    device = make_device(1)
    make_token(device)
    before = world()
    url = f"/api/gateway/devices/{device.device_id}/tokens"

    refused(post(client, f"{url}/node/rotate"), 400, "device token rotation denied", before=before)
    refused(
        post(client, f"{url}/operator/rotate", {"scopes": [sc.ADMIN]}),
        400,
        "device token rotation denied",
        before=before,
    )
    refused(
        post(client, f"/api/gateway/devices/{device_id(9)}/tokens/operator/rotate"),
        404,
        "unknown deviceId",
        before=before,
    )
    too_many = post(client, f"{url}/operator/rotate", {"scopes": [sc.READ] * (MAX_SCOPES + 1)})
    assert too_many.status_code == 400
    assert too_many.json()["error"]["message"].startswith("invalid request: at /scopes (body):")
    assert world() == before


def test_revocation_is_idempotent(client, make_device, make_token):
    device = make_device(1)
    make_token(device)
    url = f"/api/gateway/devices/{device.device_id}/tokens/operator/revoke"

    first = post(client, url)
    audited = AuditLog.objects.count()
    second = post(client, url)

    assert first.status_code == second.status_code == 200
    assert first.json()["revokedAtMs"] == second.json()["revokedAtMs"] is not None
    assert DeviceToken.objects.get().revoked_at is not None
    assert AuditLog.objects.count() == audited  # the repeat changes and audits nothing
    refused(
        post(client, f"/api/gateway/devices/{device.device_id}/tokens/node/revoke"),
        404,
        "unknown device token",
        before=world(),
    )


def test_the_token_acts_as_a_full_operator_even_beside_a_console_login_without_scopes(client, make_pairing_request):
    """The token authenticated the request: a login of the same browser without scopes is named as the actor (the
    audit row), yet does not narrow what the token may do."""
    request = make_pairing_request(1, scopes=[sc.ADMIN])
    client.force_login(operator_user("viewer"))

    response = post(client, f"/api/gateway/pairing/{request.request_id}/approve")

    assert response.status_code == 200, response.content
    assert DevicePairingRequest.objects.get(pk=request.pk).status == PairingStatus.APPROVED
    assert AuditLog.objects.get(action="device.pair.approve").actor == "user:viewer"
