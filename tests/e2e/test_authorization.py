"""Roles and scopes: node-only methods, missing scopes, unknown methods, event filtering."""

from __future__ import annotations

import asyncio

import pytest

from openclaw_client.client import ConnectError, GatewayError
from tests.support.clients import node, operator, paired_node

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_node_only_method_is_refused_to_an_operator(gateway):
    async def scenario():
        client = operator(gateway)
        await client.connect()
        with pytest.raises(GatewayError) as refused:
            await client.request("node.invoke.result", {"id": "x", "nodeId": "y", "ok": True})
        alive = await client.request("health")
        await client.close()
        return refused.value, alive

    refused, alive = asyncio.run(scenario())
    assert (refused.code, refused.message) == ("INVALID_REQUEST", "unauthorized role: operator")
    assert alive["ok"] is True


def test_operator_methods_are_refused_to_a_node(gateway):
    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        paired = await paired_node(gateway, admin)
        with pytest.raises(GatewayError) as refused:
            await paired.request("node.list")
        health = await paired.request("health")
        await paired.close()
        await admin.close()
        return refused.value, health

    refused, health = asyncio.run(scenario())
    assert (refused.code, refused.message) == ("INVALID_REQUEST", "unauthorized role: node")
    assert health["ok"] is True


def test_missing_scope_is_refused_with_details(gateway):
    async def scenario():
        reader = operator(gateway, scopes=["operator.read"])
        await reader.connect()
        listed = await reader.request("node.list")
        with pytest.raises(GatewayError) as pairing:
            await reader.request("device.pair.list")
        with pytest.raises(GatewayError) as invoke:
            await reader.request("node.invoke", {"nodeId": "n", "command": "c", "idempotencyKey": "k"})
        await reader.close()
        return listed, pairing.value, invoke.value

    listed, pairing, invoke = asyncio.run(scenario())
    assert listed["nodes"] == []
    assert (pairing.code, pairing.message) == ("INVALID_REQUEST", "missing scope: operator.pairing")
    assert pairing.details == {
        "code": "MISSING_SCOPE",
        "missingScope": "operator.pairing",
        "requiredScopes": ["operator.pairing"],
    }
    assert invoke.message == "missing scope: operator.write"


def test_no_scopes_means_no_permissions_but_health(gateway):
    async def scenario():
        client = operator(gateway, scopes=[])
        await client.connect()
        health = await client.request("health")
        with pytest.raises(GatewayError) as status:
            await client.request("status")
        await client.close()
        return health, status.value

    health, status = asyncio.run(scenario())
    assert health["ok"] is True
    assert status.message == "missing scope: operator.read"


def test_write_implies_read_and_admin_implies_everything(gateway):
    async def scenario():
        writer = operator(gateway, scopes=["operator.write"])
        await writer.connect()
        status = await writer.request("status")
        await writer.close()
        admin = operator(gateway, scopes=["operator.admin"])
        await admin.connect()
        pairs = await admin.request("device.pair.list")
        await admin.close()
        return status, pairs

    status, pairs = asyncio.run(scenario())
    assert status["runtimeVersion"]
    assert "pending" in pairs


def test_unknown_method_keeps_the_socket_usable(gateway):
    async def scenario():
        client = operator(gateway)
        await client.connect()
        with pytest.raises(GatewayError) as unknown:
            await client.request("does.not.exist")
        with pytest.raises(GatewayError) as bad_params:
            await client.request("node.describe", {"nodeId": "x", "extra": True})
        alive = await client.request("health")
        await client.close()
        return unknown.value, bad_params.value, alive

    unknown, bad_params, alive = asyncio.run(scenario())
    assert (unknown.code, unknown.message) == ("INVALID_REQUEST", "unknown method: does.not.exist")
    assert bad_params.message == "invalid node.describe params: at /extra: unexpected property"
    assert alive["ok"] is True


def test_pairing_events_reach_only_operators_with_the_pairing_scope(gateway):
    async def scenario():
        reader = operator(gateway, scopes=["operator.read"])
        pairer = operator(gateway, scopes=["operator.pairing"])
        await reader.connect()
        await pairer.connect()
        with pytest.raises(ConnectError):
            await node(gateway).connect()
        requested = await pairer.next_event("device.pair.requested")
        await pairer.close()
        await asyncio.sleep(0.2)
        reader_events = []
        while not reader.events.empty():
            reader_events.append(reader.events.get_nowait()["event"])
        await reader.close()
        return requested, reader_events

    requested, reader_events = asyncio.run(scenario())
    assert requested["payload"]["role"] == "node"
    assert isinstance(requested["seq"], int)
    assert "device.pair.requested" not in reader_events
    assert "node.pair.requested" not in reader_events
