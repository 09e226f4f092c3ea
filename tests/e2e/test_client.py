"""The protocol client keeps a node connected across gateway restarts (reconnect with backoff)."""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.test_node_invoke import node_commands
from tests.support.clients import node, operator
from tests.support.processes import start_gateway, stop_and_remove

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_a_node_reconnects_after_the_gateway_restarts(gateway_factory):
    server = gateway_factory()

    async def scenario():
        admin = operator(server)
        await admin.connect()
        worker = node(server, invoke_handler=node_commands)
        stop = asyncio.Event()
        connections = []

        async def on_connected(client):
            connections.append(client.hello["server"]["connId"])

        # Not yet paired: run_forever keeps retrying until an operator approves.
        runner = asyncio.create_task(worker.run_forever(on_connected=on_connected, backoff_initial=0.2, stop=stop))
        requested = await admin.next_event("node.pair.requested")
        await admin.request("node.pair.approve", {"requestId": requested["payload"]["requestId"]})
        await _wait_for(lambda: len(connections) == 1)
        await admin.close()

        server.stop()
        restarted = start_gateway(port=server.port)
        try:
            await _wait_for(lambda: len(connections) == 2, timeout=20)
            admin2 = operator(restarted)
            await admin2.connect()
            result = await admin2.request(
                "node.invoke", {"nodeId": worker.device_id, "command": "echo", "params": "back", "idempotencyKey": "k"}
            )
            await admin2.close()
        finally:
            stop.set()
            await asyncio.wait_for(runner, 10)
            stop_and_remove([restarted])
        return connections, result

    connections, result = asyncio.run(scenario())
    assert len(set(connections)) == 2
    assert result["payload"] == {"echoed": "back"}


async def _wait_for(predicate, timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.05)
