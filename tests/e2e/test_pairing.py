"""Device pairing of nodes: pending request, approval, device tokens, rotation and revocation."""

from __future__ import annotations

import asyncio

import pytest

from devices_app.models import DevicePairingRequest, DeviceToken, PairedDevice
from gateway.models import AuditLog, GatewayConnection
from openclaw_client.client import ConnectError, GatewayError
from tests.support.clients import node, operator, paired_node

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_unpaired_node_waits_for_approval_then_connects_with_a_device_token(gateway):
    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        candidate = node(gateway, commands=["echo"])
        with pytest.raises(ConnectError) as refused:
            await candidate.connect()
        requested = await admin.next_event("node.pair.requested")
        listed = await admin.request("node.pair.list")
        approved = await admin.request("node.pair.approve", {"requestId": refused.value.details["requestId"]})
        resolved = await admin.next_event("node.pair.resolved")

        # Same identity again, still with the shared token: now paired, gets its device token.
        accepted = node(gateway, commands=["echo"], state_dir=candidate.options.state_dir)
        hello = await accepted.connect()
        nodes = await admin.request("node.list")
        await accepted.close()

        # And with the device token alone, without the shared secret.
        token_only = node(gateway, commands=["echo"], state_dir=candidate.options.state_dir, token=None)
        hello_by_token = await token_only.connect()
        await token_only.close()
        await admin.close()
        return refused.value, requested, listed, approved, resolved, hello, nodes, hello_by_token, candidate.device_id

    refused, requested, listed, approved, resolved, hello, nodes, hello_by_token, device_id = asyncio.run(scenario())
    request_id = refused.details["requestId"]
    assert refused.code == "NOT_PAIRED"
    assert refused.message == "pairing required: device is not approved yet"
    assert refused.details["code"] == "PAIRING_REQUIRED"
    assert refused.details["reason"] == "not-paired"
    assert refused.details["deviceId"] == device_id
    assert refused.close_code == 1008
    assert refused.close_reason == f"pairing required: device is not approved yet (requestId: {request_id})"
    assert requested["payload"]["requestId"] == request_id
    assert requested["payload"]["nodeId"] == device_id
    assert [p["requestId"] for p in listed["pending"]] == [request_id]
    assert listed["pending"][0]["commands"] == ["echo"]
    assert approved["requestId"] == request_id
    assert approved["node"]["nodeId"] == device_id
    assert resolved["payload"]["decision"] == "approved"
    assert hello["auth"]["role"] == "node"
    assert hello["auth"]["deviceToken"]
    assert hello_by_token["auth"]["method"] == "device-token"
    assert "deviceToken" in hello_by_token["auth"]
    (listed_node,) = nodes["nodes"]
    assert listed_node["nodeId"] == device_id
    assert listed_node["connected"] is True
    assert listed_node["paired"] is True
    assert listed_node["commands"] == ["echo"]
    assert listed_node["approvalState"] == "approved"

    assert DevicePairingRequest.objects.get(request_id=request_id).status == "approved"
    device = PairedDevice.objects.get(device_id=device_id)
    assert device.roles == ["node"]
    assert device.approved_commands == ["echo"]
    assert DeviceToken.objects.filter(device=device, role="node", revoked_at__isnull=True).count() == 1
    assert AuditLog.objects.filter(action="device.pair.approve", target_id=device_id).count() == 1


def test_a_repeated_connect_reuses_the_open_pairing_request(gateway):
    async def scenario():
        candidate = node(gateway)
        ids = []
        for _ in range(3):
            with pytest.raises(ConnectError) as refused:
                await node(gateway, state_dir=candidate.options.state_dir).connect()
            ids.append(refused.value.details["requestId"])
        return ids

    ids = asyncio.run(scenario())
    assert len(set(ids)) == 1
    assert DevicePairingRequest.objects.count() == 1


def test_rejected_node_stays_out_and_gets_a_new_request(gateway):
    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        candidate = node(gateway)
        with pytest.raises(ConnectError) as first:
            await candidate.connect()
        rejected = await admin.request("node.pair.reject", {"requestId": first.value.details["requestId"]})
        with pytest.raises(GatewayError) as again:
            await admin.request("node.pair.approve", {"requestId": first.value.details["requestId"]})
        with pytest.raises(ConnectError) as second:
            await node(gateway, state_dir=candidate.options.state_dir).connect()
        await admin.close()
        return first.value, rejected, again.value, second.value

    first, rejected, again, second = asyncio.run(scenario())
    assert rejected["nodeId"] == first.details["deviceId"]
    assert (again.code, again.message) == ("INVALID_REQUEST", "unknown requestId")
    assert second.code == "NOT_PAIRED"
    assert second.details["requestId"] != first.details["requestId"]
    assert not PairedDevice.objects.filter(device_id=first.details["deviceId"]).exists()


def test_revoked_device_token_is_refused(gateway):
    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        paired = await paired_node(gateway, admin)
        await paired.close()
        revoked = await admin.request("device.token.revoke", {"deviceId": paired.device_id, "role": "node"})
        token_only = node(gateway, state_dir=paired.options.state_dir, token=None)
        with pytest.raises(ConnectError) as refused:
            await token_only.connect()
        await admin.close()
        return paired.device_id, revoked, refused.value

    device_id, revoked, refused = asyncio.run(scenario())
    assert revoked["deviceId"] == device_id
    assert revoked["role"] == "node"
    assert isinstance(revoked["revokedAtMs"], int)
    assert refused.code == "INVALID_REQUEST"
    assert refused.message == "unauthorized: device token mismatch (rotate/reissue device token)"
    assert refused.details["code"] == "AUTH_DEVICE_TOKEN_MISMATCH"
    assert refused.close_code == 1008
    assert DeviceToken.objects.get(device_id=device_id, role="node").revoked_at is not None


def test_rotating_a_token_closes_sessions_using_the_old_one_and_withholds_it_cross_device(gateway):
    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        paired = await paired_node(gateway, admin)
        await paired.close()
        by_token = node(gateway, state_dir=paired.options.state_dir, token=None)
        await by_token.connect()
        rotated = await admin.request("device.token.rotate", {"deviceId": paired.device_id, "role": "node"})
        await asyncio.wait_for(by_token.closed.wait(), 10)
        with pytest.raises(ConnectError) as stale:
            await node(gateway, state_dir=paired.options.state_dir, token=None).connect()
        await admin.close()
        return rotated, by_token.close_code, by_token.close_reason, stale.value

    rotated, close_code, close_reason, stale = asyncio.run(scenario())
    assert rotated["tokenDelivery"] == "withheld-cross-device"
    assert "token" not in rotated
    assert (close_code, close_reason) == (1008, "device token rotated")
    assert stale.details["code"] == "AUTH_DEVICE_TOKEN_MISMATCH"


def test_a_device_rotating_its_own_token_receives_it_in_band(gateway):
    async def scenario():
        client = operator(gateway)
        await client.connect()
        rotated = await client.request("device.token.rotate", {"deviceId": client.device_id, "role": "operator"})
        await client.close()
        return rotated

    rotated = asyncio.run(scenario())
    assert rotated["tokenDelivery"] == "in-band"
    assert rotated["token"]


def test_removing_a_node_closes_its_connection_and_forgets_it(gateway):
    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        paired = await paired_node(gateway, admin)
        removed = await admin.request("node.pair.remove", {"nodeId": paired.device_id})
        await asyncio.wait_for(paired.closed.wait(), 10)
        nodes = await admin.request("node.list")
        with pytest.raises(ConnectError) as refused:
            await node(gateway, state_dir=paired.options.state_dir).connect()
        await admin.close()
        return paired, removed, nodes, refused.value

    paired, removed, nodes, refused = asyncio.run(scenario())
    assert removed == {"nodeId": paired.device_id}
    assert (paired.close_code, paired.close_reason) == (4001, "device removed")
    assert [n for n in nodes["nodes"] if n["nodeId"] == paired.device_id and n.get("paired")] == []
    assert refused.code == "NOT_PAIRED"
    assert not GatewayConnection.objects.filter(role="node").exists()


def test_node_rename_wins_over_the_announced_name(gateway):
    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        paired = await paired_node(gateway, admin)
        renamed = await admin.request("node.rename", {"nodeId": paired.device_id, "displayName": "build box"})
        described = await admin.request("node.describe", {"nodeId": paired.device_id})
        with pytest.raises(GatewayError) as unknown:
            await admin.request("node.describe", {"nodeId": "nope"})
        await paired.close()
        await admin.close()
        return renamed, described, unknown.value

    renamed, described, unknown = asyncio.run(scenario())
    assert renamed["displayName"] == "build box"
    assert described["displayName"] == "build box"
    assert described["connected"] is True
    assert (unknown.code, unknown.message) == ("INVALID_REQUEST", "unknown nodeId")


def test_node_without_device_identity_is_refused(gateway):
    async def scenario():
        client = node(gateway, state_dir=None)
        client._identity = None
        with pytest.raises(ConnectError) as refused:
            await client.connect()
        return refused.value

    refused = asyncio.run(scenario())
    assert (refused.code, refused.message) == ("NOT_PAIRED", "device identity required")
    assert refused.details == {"code": "DEVICE_IDENTITY_REQUIRED"}


def test_removing_a_device_closes_its_sessions_and_forgets_its_tokens(gateway):
    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        other = operator(gateway)
        await other.connect()
        removed = await admin.request("device.pair.remove", {"deviceId": other.device_id})
        await asyncio.wait_for(other.closed.wait(), 10)
        listed = await admin.request("device.pair.list")
        from openclaw_client.client import GatewayError as Error

        with pytest.raises(Error) as unknown:
            await admin.request("device.pair.remove", {"deviceId": other.device_id})
        await admin.close()
        return other, removed, listed, unknown.value

    other, removed, listed, unknown = asyncio.run(scenario())
    assert removed == {"deviceId": other.device_id}
    assert (other.close_code, other.close_reason) == (4001, "device removed")
    assert other.device_id not in {d["deviceId"] for d in listed["paired"]}
    assert all("token" not in t for d in listed["paired"] for t in d["tokens"])
    assert (unknown.code, unknown.message) == ("INVALID_REQUEST", "unknown deviceId")
    assert not DeviceToken.objects.filter(device_id=other.device_id).exists()


def test_device_pair_approve_also_approves_a_node(gateway):
    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        candidate = node(gateway)
        with pytest.raises(ConnectError) as refused:
            await candidate.connect()
        listed = await admin.request("device.pair.list")
        approved = await admin.request("device.pair.approve", {"requestId": refused.value.details["requestId"]})
        accepted = node(gateway, state_dir=candidate.options.state_dir)
        hello = await accepted.connect()
        await accepted.close()
        await admin.close()
        return refused.value, listed, approved, hello

    refused, listed, approved, hello = asyncio.run(scenario())
    assert [p["requestId"] for p in listed["pending"] if p["role"] == "node"] == [refused.details["requestId"]]
    assert approved["device"]["roles"] == ["node"]
    assert hello["auth"]["role"] == "node"
