"""The benchmarks' floor socket: served only by the benchmarks' own ASGI application (``bench.settings``), beside
the project's unchanged application, and it answers without work."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from websockets.exceptions import InvalidStatus

from bench import asgi as bench_asgi
from bench import settings as bench_settings
from bench.common import FLOOR_PATH, FLOOR_SETTINGS
from openclaw_client.client import ClientOptions, GatewayClient
from openclaw_site.asgi import websocket_urlpatterns
from tests.support.processes import GatewayLaunch

# Generous timeouts: the machine is shared, and the communicator's default is one second.
TIMEOUT_S = 30


def test_the_projects_application_has_no_floor_route():
    router = URLRouter(websocket_urlpatterns)

    async def scenario():
        socket = WebsocketCommunicator(router, FLOOR_PATH)
        with pytest.raises(ValueError, match="No route found"):
            await socket.connect()

    asyncio.run(scenario())


def test_the_bench_settings_are_the_projects_but_for_the_asgi_application():
    assert settings.ASGI_APPLICATION == "openclaw_site.asgi.application"
    assert bench_settings.ASGI_APPLICATION == "bench.asgi.application"
    assert bench_settings.OPENCLAW_GATEWAY == settings.OPENCLAW_GATEWAY
    assert bench_settings.CHANNEL_LAYERS == settings.CHANNEL_LAYERS
    assert FLOOR_SETTINGS == {"DJANGO_SETTINGS_MODULE": "bench.settings"}


def test_the_floor_answers_requests_and_ignores_other_frames():
    async def scenario():
        socket = WebsocketCommunicator(bench_asgi.application, FLOOR_PATH)
        connected, _ = await socket.connect(timeout=TIMEOUT_S)
        assert connected
        challenge = json.loads(await socket.receive_from(timeout=TIMEOUT_S))
        await socket.send_to(text_data="not json")
        await socket.send_to(text_data=json.dumps({"type": "event", "event": "tick"}))
        await socket.send_to(text_data=json.dumps({"type": "req", "id": "r1", "method": "sessions.list"}))
        answer = json.loads(await socket.receive_from(timeout=TIMEOUT_S))
        quiet = await socket.receive_nothing()
        await socket.disconnect()
        return challenge, answer, quiet

    challenge, answer, quiet = asyncio.run(scenario())
    assert challenge["event"] == "connect.challenge" and challenge["payload"]["nonce"]
    assert answer == {"type": "res", "id": "r1", "ok": True, "payload": {}}
    assert quiet


@pytest.mark.parametrize("path", ["/bench/floor/extra", "/no/such/socket"])
def test_every_other_websocket_path_goes_to_the_projects_routing(path):
    async def scenario():
        socket = WebsocketCommunicator(bench_asgi.application, path)
        # The project's URLRouter refuses it; the floor's route would have accepted. (The refusal shows once the
        # communicator's wait ends: its short default is enough.)
        with pytest.raises(ValueError, match="No route found"):
            await socket.connect()

    asyncio.run(scenario())


def test_a_request_before_connect_on_the_gateways_socket_is_the_gateways_to_refuse():
    async def scenario():
        socket = WebsocketCommunicator(bench_asgi.application, "/")
        connected, _ = await socket.connect(timeout=TIMEOUT_S)
        assert connected
        challenge = json.loads(await socket.receive_from(timeout=TIMEOUT_S))
        await socket.send_to(text_data=json.dumps({"type": "req", "id": "r1", "method": "health"}))
        answer = json.loads(await socket.receive_from(timeout=TIMEOUT_S))
        closed = await socket.receive_output(timeout=TIMEOUT_S)
        await socket.disconnect()
        return challenge, answer, closed

    challenge, answer, closed = asyncio.run(scenario())
    assert challenge["event"] == "connect.challenge"
    # The floor would have answered ok and stayed open.
    assert (answer["id"], answer["ok"]) == ("r1", False)
    assert closed["type"] == "websocket.close" and closed["code"] == 1008


@pytest.mark.slow
@pytest.mark.parametrize("with_floor", [False, True])
def test_a_gateway_served_with_the_bench_settings_routes_the_floor_and_stays_the_gateway(with_floor):
    """``manage.py serve`` as the README runs it; the project's client completes its handshake with the floor (the
    benchmark's path) only under the bench settings, and the gateway's own socket answers in both."""
    launch = GatewayLaunch.prepare(settings=FLOOR_SETTINGS if with_floor else {}, token="floor-token", clean_env=True)
    try:
        launch.migrate()
        gateway = launch.start(worker=False)
        try:

            async def health(url: str):
                client = GatewayClient(ClientOptions(url=url, token="floor-token"))
                await client.connect()
                try:
                    return await client.request("health")
                finally:
                    await client.close()

            assert asyncio.run(health(gateway.url))["ok"] is True
            if with_floor:
                assert asyncio.run(health(gateway.url + FLOOR_PATH)) == {}
            else:
                # Daphne refuses the upgrade of a path no route takes (HTTP 500 from channels' URLRouter).
                with pytest.raises(InvalidStatus):
                    asyncio.run(health(gateway.url + FLOOR_PATH))
        finally:
            gateway.stop()
    finally:
        launch.remove_state()
