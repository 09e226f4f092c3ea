"""Several gateway processes sharing the database and the Redis channel layer."""

from __future__ import annotations

import asyncio
import signal

import pytest

from openclaw_client.client import GatewayError
from tests.e2e.test_node_invoke import node_commands
from tests.support.clients import operator, paired_node

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.django_db(transaction=True)]


def test_a_node_on_process_a_is_invoked_through_process_b(gateway_factory):
    process_a = gateway_factory()
    process_b = gateway_factory()

    async def scenario():
        admin_a = operator(process_a)
        await admin_a.connect()
        worker = await paired_node(process_a, admin_a, invoke_handler=node_commands)
        admin_b = operator(process_b)
        await admin_b.connect()
        nodes_seen_by_b = await admin_b.request("node.list")
        result = await admin_b.request(
            "node.invoke",
            {"nodeId": worker.device_id, "command": "echo", "params": {"from": "b"}, "idempotencyKey": "k"},
        )
        with pytest.raises(GatewayError) as failed:
            await admin_b.request(
                "node.invoke", {"nodeId": worker.device_id, "command": "fail", "idempotencyKey": "k2"}
            )
        status = await admin_b.request("status")
        boot_ids = {admin_a.hello["server"]["bootId"], admin_b.hello["server"]["bootId"]}
        await worker.close()
        await admin_a.close()
        await admin_b.close()
        return worker.device_id, nodes_seen_by_b, result, failed.value, status, boot_ids

    node_id, nodes_seen_by_b, result, failed, status, boot_ids = asyncio.run(scenario())
    assert [(n["nodeId"], n["connected"]) for n in nodes_seen_by_b["nodes"]] == [(node_id, True)]
    assert result["payload"] == {"echoed": {"from": "b"}}
    assert failed.details == {"nodeError": {"code": "SYSTEM_RUN_DENIED", "message": "denied by policy"}}
    assert len(boot_ids) == 2
    assert boot_ids <= {p["bootId"] for p in status["gatewayProcesses"]}


def test_pairing_events_cross_processes_and_removal_closes_the_node_elsewhere(gateway_factory):
    process_a = gateway_factory()
    process_b = gateway_factory()

    async def scenario():
        watcher_b = operator(process_b)
        await watcher_b.connect()
        admin_a = operator(process_a)
        await admin_a.connect()
        worker = await paired_node(process_a, admin_a, invoke_handler=node_commands)
        requested = await watcher_b.next_event("node.pair.requested")
        await watcher_b.request("node.pair.remove", {"nodeId": worker.device_id})
        await asyncio.wait_for(worker.closed.wait(), 10)
        await admin_a.close()
        await watcher_b.close()
        return worker, requested

    worker, requested = asyncio.run(scenario())
    assert requested["payload"]["nodeId"] == worker.device_id
    assert (worker.close_code, worker.close_reason) == (4001, "device removed")


def test_a_killed_process_stops_routing_to_its_nodes(gateway_factory):
    """After a crash its connections are no longer routable: invoke answers NOT_CONNECTED, not a hang."""
    process_a = gateway_factory(
        extra_env={"OPENCLAW_PROCESS_STALE_AFTER_MS": "1500", "OPENCLAW_PROCESS_HEARTBEAT_INTERVAL_MS": "500"}
    )
    process_b = gateway_factory(
        extra_env={"OPENCLAW_PROCESS_STALE_AFTER_MS": "1500", "OPENCLAW_PROCESS_HEARTBEAT_INTERVAL_MS": "500"}
    )

    async def scenario():
        admin_a = operator(process_a)
        await admin_a.connect()
        worker = await paired_node(process_a, admin_a, invoke_handler=node_commands)
        admin_b = operator(process_b)
        await admin_b.connect()
        process_a.stop(signal.SIGKILL)
        await asyncio.sleep(2.5)
        with pytest.raises(GatewayError) as offline:
            await admin_b.request("node.invoke", {"nodeId": worker.device_id, "command": "echo", "idempotencyKey": "k"})
        nodes = await admin_b.request("node.list")
        await admin_b.close()
        return offline.value, nodes

    offline, nodes = asyncio.run(scenario())
    assert (offline.message, offline.details) == ("node not connected", {"code": "NOT_CONNECTED"})
    assert [n["connected"] for n in nodes["nodes"]] == [False]


@pytest.mark.slow
def test_idle_connections_survive_the_redis_layer_poll(gateway_factory):
    """channels_redis polls with a 5 s BRPOP: an idle socket must outlive several polls."""
    server = gateway_factory()

    async def scenario():
        client = operator(server)
        await client.connect()
        await asyncio.sleep(12)
        health = await client.request("health")
        status = await client.request("status")
        await client.close()
        return client.closed.is_set(), health, status

    _closed, health, status = asyncio.run(scenario())
    assert health["ok"] is True
    assert status["connections"]["local"] == 1
    assert "Exception inside application" not in server.log()
