"""The nodes JSON API, full stack: node.list / describe / rename / pair.remove over their services, and
every refusal with its status, exact message and no change."""

from __future__ import annotations

import pytest
from django.test import Client

from devices_app import selectors as device_selectors
from devices_app.models import DeviceToken, PairedDevice
from gateway import scopes as sc
from gateway.models import AuditLog, GatewayConnection
from tests.support.api import API_TOKEN

from .test_api_pairing import device_id, world

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _token(api_token):
    return api_token


@pytest.fixture
def client() -> Client:
    return Client(headers={"Authorization": f"Bearer {API_TOKEN}"})


@pytest.fixture
def node(make_device, make_token) -> PairedDevice:
    device = make_device(1, roles=[sc.ROLE_NODE])
    make_token(device, sc.ROLE_NODE)
    return device


def refused(response, status: int, message: str, *, before: dict) -> None:
    assert response.status_code == status, response.content
    assert response.json()["error"] == {"code": "INVALID_REQUEST", "message": message}
    assert world() == before


def test_every_route_needs_the_gateway_token(node):
    before = world()
    routes = [
        ("get", "/api/gateway/nodes"),
        ("get", "/api/gateway/nodes/pairing"),
        ("get", f"/api/gateway/nodes/{node.device_id}"),
        ("patch", f"/api/gateway/nodes/{node.device_id}"),
        ("delete", f"/api/gateway/nodes/{node.device_id}"),
    ]
    for verb, url in routes:
        assert getattr(Client(), verb)(url, content_type="application/json").status_code == 401, url
        wrong = Client(headers={"Authorization": "Bearer wrong"})
        assert getattr(wrong, verb)(url, content_type="application/json").status_code == 401, url
    assert world() == before


def test_the_list_shows_paired_pending_and_connected_nodes_connected_first(
    client, node, make_device, make_connection, make_pairing_request
):
    connected = make_device(2, roles=[sc.ROLE_NODE])
    make_connection(connected, sc.ROLE_NODE)
    pending = make_pairing_request(3, role=sc.ROLE_NODE, scopes=[])

    response = client.get("/api/gateway/nodes")

    assert response.status_code == 200
    nodes = response.json()["nodes"]
    assert nodes == device_selectors.node_catalog(include_pending=True)
    assert [(n["nodeId"], n["connected"], n["approvalState"]) for n in nodes] == [
        (device_id(2), True, "approved"),
        (device_id(1), False, "approved"),
        (device_id(3), False, "pending-approval"),
    ]
    assert nodes[2]["pendingRequestId"] == str(pending.pk)


def test_describe_answers_one_node_as_it_is_now(client, node):
    response = client.get(f"/api/gateway/nodes/{node.device_id}")

    assert response.status_code == 200
    body = response.json()
    assert isinstance(body.pop("ts"), int)
    assert body == next(n for n in device_selectors.node_catalog(include_pending=True) if n["nodeId"] == node.device_id)
    assert (body["paired"], body["connected"], body["displayName"]) == (True, False, "Device 1")


def test_an_unknown_or_overlong_node_id_is_refused(client, node, make_device):
    operator_only = make_device(2)
    before = world()

    refused(client.get(f"/api/gateway/nodes/{device_id(9)}"), 404, "unknown nodeId", before=before)
    refused(client.delete(f"/api/gateway/nodes/{device_id(9)}"), 404, "unknown nodeId", before=before)
    refused(client.delete(f"/api/gateway/nodes/{operator_only.device_id}"), 404, "unknown nodeId", before=before)
    overlong = client.get("/api/gateway/nodes/" + "n" * 201)
    assert overlong.status_code == 400
    assert overlong.json()["error"]["message"].startswith("invalid request: at /nodeId (path):")
    assert world() == before


def test_rename_sets_the_operators_name(client, node):
    response = client.patch(
        f"/api/gateway/nodes/{node.device_id}", {"displayName": "  Build box "}, content_type="application/json"
    )

    assert response.status_code == 200
    assert response.json() == {"nodeId": node.device_id, "displayName": "Build box"}
    assert client.get(f"/api/gateway/nodes/{node.device_id}").json()["displayName"] == "Build box"
    assert AuditLog.objects.get(action="node.rename").actor == "api:token"


def test_rename_refusals_change_nothing(client, node):
    before = world()
    url = f"/api/gateway/nodes/{node.device_id}"

    def rename(body: dict, target: str = url):
        return client.patch(target, body, content_type="application/json")

    refused(rename({"displayName": "   "}), 400, "displayName required", before=before)
    refused(rename({"displayName": "x"}, f"/api/gateway/nodes/{device_id(9)}"), 404, "unknown nodeId", before=before)
    for body in ({}, {"displayName": ""}, {"displayName": "x" * 201}, {"displayName": "x", "label": "y"}):
        response = rename(body)
        assert response.status_code == 400, body
        assert response.json()["error"]["message"].startswith("invalid request: at /")
    assert world() == before


def test_removing_a_node_withdraws_the_role_and_closes_its_connections(client, node, make_device, make_connection):
    both = make_device(2, roles=[sc.ROLE_OPERATOR, sc.ROLE_NODE])
    make_connection(both, sc.ROLE_NODE)

    removed = client.delete(f"/api/gateway/nodes/{node.device_id}")
    withdrawn = client.delete(f"/api/gateway/nodes/{both.device_id}")

    assert (removed.status_code, removed.json()) == (200, {"nodeId": node.device_id})
    assert (withdrawn.status_code, withdrawn.json()) == (200, {"nodeId": both.device_id})
    assert not PairedDevice.objects.filter(pk=node.pk).exists()
    assert not DeviceToken.objects.filter(device_id=node.device_id).exists()
    assert PairedDevice.objects.get(pk=both.pk).roles == [sc.ROLE_OPERATOR]
    assert not GatewayConnection.objects.filter(device_id=both.device_id, role=sc.ROLE_NODE).exists()
    assert client.get("/api/gateway/nodes").json()["nodes"] == []
    refused(client.delete(f"/api/gateway/nodes/{node.device_id}"), 404, "unknown nodeId", before=world())
