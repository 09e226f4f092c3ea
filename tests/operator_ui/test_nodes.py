"""The console's nodes page: pending node pairings approved or rejected, paired nodes removed after a
confirmation, each through the pairing services (audited as the logged-in user, refusals shown)."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.layers import get_channel_layer
from django.contrib.messages import get_messages
from django.urls import reverse

from devices_app.models import DevicePairingRequest, PairedDevice
from devices_app.services import connections as device_connections
from devices_app.services import pairing
from gateway import events, state
from gateway import scopes as sc
from gateway.audit import Actor
from gateway.models import AuditLog
from gateway.services import connections
from tests.devices_app.test_services_pairing import claim
from tests.operator_ui.test_pairing import (
    _live,
    layer,  # noqa: F401 (a fixture)
)
from tests.support.connections import connection_record
from tests.support.operators import operator_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator_client(client):
    """Sessions (``operator.write``: the nodes page is ``node.list``'s) and pairing (``node.pair.*``)."""
    client.force_login(operator_user("ops", sc.WRITE, sc.PAIRING))
    return client


NODE = "e" * 64
WAITING = "approved — waiting for the node to reconnect"


def pending_request(node_id: str = NODE, **extra) -> DevicePairingRequest:
    request, _created = pairing.pairing_request_ensure(claim=claim(node_id, display_name="build-box", **extra))
    return request


def decide(client, request: DevicePairingRequest, decision: str):
    url = reverse("ui:node-request", kwargs={"request_id": str(request.request_id), "decision": decision})
    return client.post(url, follow=True)


def messages_of(response) -> list[str]:
    return [message.message for message in get_messages(response.wsgi_request)]


def test_the_nodes_page_lists_pending_requests_and_paired_nodes(operator_client):
    pending_request()
    paired = pending_request("f" * 64)
    pairing.pairing_request_approve(request_id=str(paired.request_id), actor=Actor.system(), role="node")

    page = operator_client.get(reverse("ui:nodes")).content.decode()

    pending_part, nodes_part = page.split('id="nodes-title"')
    assert NODE in pending_part and "Approve" in pending_part
    assert "f" * 64 in nodes_part and WAITING in nodes_part and "Remove…" in nodes_part


def test_approving_a_pending_node_pairs_it_and_is_audited_as_the_user(operator_client):
    request = pending_request()

    response = decide(operator_client, request, "approve")

    assert messages_of(response) == [f"Approved node {NODE}; waiting for it to reconnect."]
    assert PairedDevice.objects.get(device_id=NODE).has_role("node")
    assert AuditLog.objects.filter(actor="user:ops", target_id=NODE).exists()


def test_rejecting_leaves_the_node_unpaired_and_a_second_decision_shows_the_services_refusal(operator_client):
    request = pending_request()

    rejected = decide(operator_client, request, "reject")
    again = decide(operator_client, request, "approve")

    assert messages_of(rejected) == [f"Rejected the pairing request of node {NODE}."]
    assert not PairedDevice.objects.filter(device_id=NODE).exists()
    [refusal] = messages_of(again)
    assert refusal and "Approved" not in refusal
    assert not PairedDevice.objects.filter(device_id=NODE).exists()


def test_an_unknown_decision_is_404_and_changes_nothing(operator_client):
    request = pending_request()

    response = operator_client.post(
        reverse("ui:node-request", kwargs={"request_id": str(request.request_id), "decision": "maybe"})
    )

    assert response.status_code == 404
    assert DevicePairingRequest.objects.get(pk=request.pk).status == request.status


def test_removing_a_node_asks_for_confirmation_first(operator_client):
    request = pending_request()
    pairing.pairing_request_approve(request_id=str(request.request_id), actor=Actor.system(), role="node")
    url = reverse("ui:node-remove", kwargs={"node_id": NODE})

    confirmation = operator_client.get(url)
    assert confirmation.status_code == 200 and "Remove node" in confirmation.content.decode()
    assert PairedDevice.objects.filter(device_id=NODE).exists()  # a GET changes nothing

    removed = operator_client.post(url, follow=True)

    assert messages_of(removed) == [f"Removed node {NODE}."]
    assert not PairedDevice.objects.filter(device_id=NODE).exists()
    assert AuditLog.objects.filter(action="node.pair.remove", actor="user:ops", target_id=NODE).exists()


def test_removing_an_unknown_node_shows_the_services_refusal(operator_client):
    assert operator_client.get(reverse("ui:node-remove", kwargs={"node_id": NODE})).status_code == 404

    response = operator_client.post(reverse("ui:node-remove", kwargs={"node_id": NODE}), follow=True)

    assert messages_of(response) == ["unknown nodeId"]


def test_an_empty_nodes_page_says_how_to_add_one(operator_client):
    page = operator_client.get(reverse("ui:nodes")).content.decode()

    assert "No node is waiting for approval." in page and "No nodes yet." in page


def test_the_nodes_page_shows_a_nodes_host_stats_and_what_it_declares_while_connected(operator_client):
    node_id = "f" * 64
    paired = pending_request(node_id)
    pairing.pairing_request_approve(request_id=str(paired.request_id), actor=Actor.system(), role="node")
    stats = {"cpuCount": 8, "loadAverage": [1.5, 1, 1], "memoryTotalBytes": 16 * 2**30, "memoryFreeBytes": 4 * 2**30}
    PairedDevice.objects.filter(device_id=node_id).update(host_stats={**stats, "updatedAtMs": 1})

    offline = operator_client.get(reverse("ui:nodes")).content.decode().split('id="nodes-title"')[1]

    assert "8 CPU, load 1.50" in offline and "memory 4.0\xa0GB free of 16.0\xa0GB" in offline
    assert "disk " not in offline  # no disk values in the sample, no disk line

    connections.process_register(boot_id=state.BOOT_ID)
    record = connection_record(
        boot_id=state.BOOT_ID, channel_name="inmemory!n", role="node", device_id=node_id, node_id=node_id
    )
    device_connections.connection_register(record=record)
    PairedDevice.objects.filter(device_id=node_id).update(
        node_skills=[{"name": "deploy", "description": "How to deploy", "content": "..."}],
        node_plugin_tools=[{"pluginId": "camera", "name": "snap", "description": "Take a photo", "command": "c"}],
    )

    online = operator_client.get(reverse("ui:nodes")).content.decode().split('id="nodes-title"')[1]

    assert 'Skills: <span title="How to deploy">deploy</span>' in online
    assert 'Tools: <span title="Take a photo">camera/snap</span>' in online


def node_row(page: str, node_id: str) -> str:
    nodes_part = page.split('id="nodes-title"')[1]
    return next(row for row in nodes_part.split("<tr>") if node_id in row)


def connect(node_id: str) -> str:
    connections.process_register(boot_id=state.BOOT_ID)
    record = connection_record(
        boot_id=state.BOOT_ID, channel_name=f"inmemory!{node_id[:8]}", role="node", device_id=node_id, node_id=node_id
    )
    device_connections.connection_register(record=record)
    return record.conn_id


def test_an_approved_node_reads_waiting_to_reconnect_until_it_connects_then_online_then_offline(operator_client):
    request = pending_request()
    decide(operator_client, request, "approve")

    waiting = node_row(operator_client.get(reverse("ui:nodes")).content.decode(), NODE)
    assert WAITING in waiting and "offline" not in waiting

    conn_id = connect(NODE)
    online = node_row(operator_client.get(reverse("ui:nodes")).content.decode(), NODE)
    assert "online" in online and WAITING not in online

    device_connections.connection_unregister(conn_id=conn_id)
    offline = node_row(operator_client.get(reverse("ui:nodes")).content.decode(), NODE)
    assert "offline" in offline and WAITING not in offline


def test_a_reader_without_pairing_sees_the_waiting_node_and_follows_presence_only(client):
    request = pending_request()
    pairing.pairing_request_approve(request_id=str(request.request_id), actor=Actor.system(), role="node")
    client.force_login(operator_user("reader", sc.READ))

    page = client.get(reverse("ui:nodes")).content.decode()

    assert WAITING in node_row(page, NODE)
    assert 'data-live-topics="nodes"' in page
    assert 'data-live-events="node.pair.requested node.pair.resolved presence"' in page
    assert "Approve" not in page


def test_the_decision_cell_is_a_table_cell_holding_both_forms(operator_client):
    pending_request()

    page = operator_client.get(reverse("ui:nodes")).content.decode()

    cell = page.split('<td data-label="Decision" class="node-decision">', 1)[1].split("</td>", 1)[0]
    assert cell.count('<form method="post"') == 2 and 'class="decision-buttons"' in cell
    assert 'data-live-topics="nodes,pairing"' in page


# --- the nodes page's live topic -------------------------------------------------------------------


def broadcast(event: str, payload: dict):
    return get_channel_layer().group_send(events.BROADCAST_GROUP, events.broadcast_message(event, payload))


@pytest.mark.usefixtures("layer")
@pytest.mark.django_db(transaction=True)
def test_the_nodes_topic_passes_presence_on_to_a_reader_and_pairing_events_only_with_pairing():
    reader = operator_user("reader", sc.READ)
    pairer = operator_user("pairer", sc.READ, sc.PAIRING)
    resolved = {"requestId": "r1", "nodeId": NODE, "decision": "approved", "ts": 1}

    async def received(user, query: str) -> list[dict]:
        socket = _live(user, query)
        connected, _ = await socket.connect()
        assert connected
        await broadcast("node.pair.resolved", resolved)
        await broadcast("presence", {"presence": []})
        await broadcast("device.pair.requested", {})
        frames = []
        while not await socket.receive_nothing():
            frames.append(json.loads(await socket.receive_from()))
        await socket.disconnect()
        return frames

    reader_frames = asyncio.run(received(reader, "?topics=nodes,pairing"))
    pairer_frames = asyncio.run(received(pairer, "?topics=nodes,pairing"))

    assert [frame["event"] for frame in reader_frames] == ["presence"]
    assert [frame["event"] for frame in pairer_frames] == ["node.pair.resolved", "presence", "device.pair.requested"]


@pytest.mark.usefixtures("layer")
@pytest.mark.django_db(transaction=True)
def test_the_nodes_topic_is_not_joined_without_operator_read():
    nobody = operator_user("nobody")

    async def scenario():
        socket = _live(nobody, "?topics=nodes")
        connected, _ = await socket.connect()
        await broadcast("presence", {"presence": []})
        quiet = await socket.receive_nothing()
        await socket.disconnect()
        return connected, quiet

    connected, quiet = asyncio.run(scenario())

    assert connected and quiet
