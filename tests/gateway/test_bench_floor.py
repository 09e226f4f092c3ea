"""The benchmarks' floor socket: routed only when OPENCLAW_BENCH_FLOOR asks for it, and it answers without work."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from websockets.exceptions import InvalidStatus

from openclaw_client.client import ClientOptions, GatewayClient
from openclaw_site.asgi import websocket_routes
from tests.support.processes import GatewayLaunch


def test_without_the_setting_there_is_no_floor_route():
    router = URLRouter(websocket_routes(bench_floor=False))

    async def scenario():
        socket = WebsocketCommunicator(router, "/bench/floor")
        with pytest.raises(ValueError, match="No route found"):
            await socket.connect()

    asyncio.run(scenario())


def test_the_floor_answers_requests_and_ignores_other_frames():
    router = URLRouter(websocket_routes(bench_floor=True))

    async def scenario():
        socket = WebsocketCommunicator(router, "/bench/floor")
        # Generous timeouts: the machine is shared, and the communicator's default is one second.
        connected, _ = await socket.connect(timeout=30)
        assert connected
        challenge = json.loads(await socket.receive_from(timeout=30))
        await socket.send_to(text_data="not json")
        await socket.send_to(text_data=json.dumps({"type": "event", "event": "tick"}))
        await socket.send_to(text_data=json.dumps({"type": "req", "id": "r1", "method": "sessions.list"}))
        answer = json.loads(await socket.receive_from(timeout=30))
        quiet = await socket.receive_nothing()
        await socket.disconnect()
        return challenge, answer, quiet

    challenge, answer, quiet = asyncio.run(scenario())
    assert challenge["event"] == "connect.challenge" and challenge["payload"]["nonce"]
    assert answer == {"type": "res", "id": "r1", "ok": True, "payload": {}}
    assert quiet


@pytest.mark.slow
@pytest.mark.parametrize("enabled", [False, True])
def test_a_served_gateway_routes_the_floor_only_with_the_setting(enabled):
    """The project's client completes its handshake with the floor (the benchmark's path) only when it is on."""
    settings = {"OPENCLAW_BENCH_FLOOR": "1"} if enabled else {}
    launch = GatewayLaunch.prepare(settings=settings, token="floor-token", clean_env=True)
    try:
        launch.migrate()
        gateway = launch.start(worker=False)
        try:

            async def scenario():
                client = GatewayClient(ClientOptions(url=f"{gateway.url}/bench/floor", token="floor-token"))
                await client.connect()
                try:
                    return await client.request("health")
                finally:
                    await client.close()

            if enabled:
                assert asyncio.run(scenario()) == {}
            else:
                # Daphne refuses the upgrade of a path no route takes (HTTP 500 from channels' URLRouter).
                with pytest.raises(InvalidStatus):
                    asyncio.run(scenario())
        finally:
            gateway.stop()
    finally:
        launch.remove_state()
