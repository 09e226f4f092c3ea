"""The console's pairing over a real gateway process: a staff user's pairing page socket
(``/ui/live/?topics=pairing``) hears a node ask to pair and the approval made from the console; a token
rotated on the pairing page is the one the node then connects with, and its old token no longer works."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest
import websockets

from gateway import scopes as sc
from gateway.models import AuditLog
from openclaw_client.client import ConnectError
from openclaw_client.identity import IdentityStore
from tests.e2e.test_console_live import PASSWORD, cookie_header, post_form
from tests.support.clients import node
from tests.support.operators import operator_user

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def staff_logged_in(gateway, django_user_model) -> httpx.Client:
    operator_user("boss", sc.ADMIN, password=PASSWORD, is_staff=True)
    client = httpx.Client(base_url=gateway.http_url, follow_redirects=False, timeout=10)
    client.get("/ui/login/")
    response = client.post(
        "/ui/login/",
        data={"username": "boss", "password": PASSWORD, "csrfmiddlewaretoken": client.cookies["csrftoken"]},
        headers={"Referer": f"{gateway.http_url}/ui/login/"},
    )
    assert response.status_code == 302, response.text
    return client


async def next_frame(socket, event: str) -> dict:
    while True:
        frame = json.loads(await asyncio.wait_for(socket.recv(), 15))
        if frame["event"] == event:
            return frame


def test_the_pairing_page_hears_pairing_live_and_a_rotated_token_is_the_nodes_new_one(gateway, django_user_model):
    client = staff_logged_in(gateway, django_user_model)
    assert 'data-live-topics="pairing"' in client.get("/ui/pairing/").text

    async def scenario():
        socket = await websockets.connect(
            f"{gateway.url}/ui/live/?topics=pairing",
            origin=gateway.http_url,
            additional_headers={"Cookie": cookie_header(client)},
        )
        try:
            candidate = node(gateway, commands=["echo"])
            with pytest.raises(ConnectError) as refused:
                await candidate.connect()
            request_id = refused.value.details["requestId"]
            requested = await next_frame(socket, "device.pair.requested")
            approved = await asyncio.to_thread(
                post_form, client, gateway, f"/ui/nodes/requests/{request_id}/approve", {}
            )
            assert approved.status_code == 302
            resolved = await next_frame(socket, "device.pair.resolved")
        finally:
            await socket.close()

        # Paired: the node connects and keeps the device token it is given.
        state_dir = candidate.options.state_dir
        first = node(gateway, commands=["echo"], state_dir=state_dir)
        await first.connect()
        await first.close()
        device_id = candidate.device_id

        rotated = await asyncio.to_thread(
            post_form, client, gateway, f"/ui/pairing/devices/{device_id}/tokens/node/rotate", {}
        )
        assert rotated.status_code == 200, rotated.text
        secret = re.search(r'id="new-token"[^>]*>([^<]+)</textarea>', rotated.text).group(1)

        with pytest.raises(ConnectError) as old_refused:
            await node(gateway, commands=["echo"], state_dir=state_dir, token=None).connect()
        IdentityStore(state_dir).save_device_token("node", secret, [])
        with_new = node(gateway, commands=["echo"], state_dir=state_dir, token=None)
        hello = await with_new.connect()
        await with_new.close()
        return request_id, device_id, requested, resolved, old_refused.value, hello, rotated

    request_id, device_id, requested, resolved, old_refused, hello, rotated = asyncio.run(scenario())

    assert requested["payload"]["requestId"] == request_id
    assert requested["payload"]["deviceId"] == device_id
    assert resolved["payload"] == {**resolved["payload"], "requestId": request_id, "decision": "approved"}
    assert "Copy it now: it is not shown again." in rotated.text
    assert "no-store" in rotated.headers["Cache-Control"]
    assert old_refused.details.get("code") == "AUTH_DEVICE_TOKEN_MISMATCH"
    assert hello["auth"]["role"] == "node" and hello["auth"]["method"] == "device-token"
    row = AuditLog.objects.get(action="device.token.rotate", target_id=device_id)
    assert (row.actor, row.data["tokenDelivery"]) == ("user:boss", "shown-to-operator")
    assert AuditLog.objects.filter(action="device.pair.approve", actor="user:boss", target_id=device_id).exists()
