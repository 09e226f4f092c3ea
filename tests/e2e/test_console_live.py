"""The console's live updates over a real gateway process: a logged-in operator's page socket
(``/ui/live/``) receives the session events of a turn sent from the console, the reply streaming in
before the turn ends; an anonymous or cross-origin socket is refused before it is accepted."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest
import websockets

from gateway import scopes as sc
from tests.support.operators import operator_user

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PASSWORD = "a-long-enough-password"


def logged_in(gateway, django_user_model, *scopes: str, **user_fields) -> httpx.Client:
    """An HTTP client holding a console login (``operator.write`` unless ``scopes`` say) made through the real
    login form."""
    operator_user("ops", *(scopes or (sc.WRITE,)), password=PASSWORD, **user_fields)
    client = httpx.Client(base_url=gateway.http_url, follow_redirects=False, timeout=10)
    client.get("/ui/login/")
    response = client.post(
        "/ui/login/",
        data={"username": "ops", "password": PASSWORD, "csrfmiddlewaretoken": client.cookies["csrftoken"]},
        headers={"Referer": f"{gateway.http_url}/ui/login/"},
    )
    assert response.status_code == 302, response.text
    return client


def cookie_header(client: httpx.Client) -> str:
    return "; ".join(f"{name}={value}" for name, value in client.cookies.items())


async def open_live(gateway, *, origin: str | None, cookie: str = ""):
    headers = {"Cookie": cookie} if cookie else {}
    return await websockets.connect(f"{gateway.url}/ui/live/", origin=origin, additional_headers=headers)


def post_form(client: httpx.Client, gateway, path: str, data: dict) -> httpx.Response:
    return client.post(
        path,
        data={**data, "csrfmiddlewaretoken": client.cookies["csrftoken"]},
        headers={"Referer": f"{gateway.http_url}/ui/"},
    )


def test_a_turn_sent_from_the_console_streams_to_the_operators_page_socket(gateway, django_user_model):
    client = logged_in(gateway, django_user_model)
    assert post_form(client, gateway, "/ui/sessions/new", {"key": "agent:main:live"}).status_code == 302
    page = client.get("/ui/sessions/agent:main:live/").text
    idempotency_key = re.search(r'name="idempotencyKey" value="([^"]+)"', page).group(1)

    async def scenario():
        socket = await open_live(gateway, origin=gateway.http_url, cookie=cookie_header(client))
        try:
            sent = await asyncio.to_thread(
                post_form,
                client,
                gateway,
                "/ui/sessions/agent:main:live/send",
                {"message": "Reply exactly: live from the console", "idempotencyKey": idempotency_key},
            )
            assert sent.status_code == 302
            frames = []
            while not any(f["event"] == "chat" and f["payload"]["state"] == "final" for f in frames):
                frames.append(json.loads(await asyncio.wait_for(socket.recv(), 15)))
            return frames
        finally:
            await socket.close()

    frames = asyncio.run(scenario())
    chat = [frame["payload"] for frame in frames if frame["event"] == "chat"]
    assert {frame["event"] for frame in frames} <= {"chat", "sessions.changed"}
    assert all(payload["sessionKey"] == "agent:main:live" for payload in chat)
    states = [payload["state"] for payload in chat]
    assert "delta" in states and states.index("delta") < states.index("final")
    assert chat[-1]["message"]["content"][0]["text"] == "live from the console"
    assert any(frame["event"] == "sessions.changed" for frame in frames)
    # The page shows the reply once it reloads its parts, and no stop button for the turn that ended.
    refreshed = client.get("/ui/sessions/agent:main:live/", headers={"X-Requested-With": "console"}).text
    assert "live from the console" in refreshed
    assert re.search(r'<div data-live-region="abort">\s*</div>', refreshed)


def test_a_dispatch_from_the_console_reports_its_stages_to_the_page_socket(gateway_factory, django_user_model):
    """A staff operator dispatches to a worker profile whose host is missing: each placement change reaches
    the page's socket as it happens, and the part the page then fetches shows where the dispatch failed."""
    profiles = {"dev": {"provider": "static-ssh", "install": "bundle", "settings": {}}}
    gateway = gateway_factory(extra_env={"OPENCLAW_WORKER_PROFILES": json.dumps(profiles)})
    client = logged_in(gateway, django_user_model, sc.ADMIN, is_staff=True)
    assert post_form(client, gateway, "/ui/sessions/new", {"key": "agent:main:placed"}).status_code == 302
    assert 'value="profile:dev"' in client.get("/ui/sessions/agent:main:placed/").text

    async def scenario():
        socket = await open_live(gateway, origin=gateway.http_url, cookie=cookie_header(client))
        try:
            sent = await asyncio.to_thread(
                post_form, client, gateway, "/ui/sessions/agent:main:placed/dispatch", {"target": "profile:dev"}
            )
            assert sent.status_code == 302
            states = []
            while "failed" not in states:
                frame = json.loads(await asyncio.wait_for(socket.recv(), 15))
                payload = frame["payload"]
                if frame["event"] == "sessions.changed" and payload.get("reason") == "placement":
                    assert payload["sessionKey"] == "agent:main:placed"
                    states.append(payload["placement"]["state"])
            return states
        finally:
            await socket.close()

    states = asyncio.run(scenario())
    assert states == ["local", "requested", "provisioning", "failed"]  # the first dispatch creates the row
    part = client.get("/ui/sessions/agent:main:placed/", headers={"X-Requested-With": "console"}).text
    stages = re.findall(r'<li class="stage stage-(\w+)"', part)
    assert stages == ["done", "failed", "pending", "pending", "pending"]
    assert "Worker dispatch failed in provisioning: " in part
    assert "Dispatch failed in provisioning." in part


@pytest.mark.parametrize("case", ["anonymous", "another origin", "no origin"])
def test_a_page_socket_without_a_login_or_from_another_origin_is_refused(gateway, django_user_model, case):
    client = logged_in(gateway, django_user_model)
    origin, cookie = {
        "anonymous": (gateway.http_url, ""),
        "another origin": ("http://evil.example", cookie_header(client)),
        "no origin": (None, cookie_header(client)),
    }[case]

    async def scenario():
        try:
            socket = await open_live(gateway, origin=origin, cookie=cookie)
        except websockets.InvalidStatus as refused:
            return refused.response.status_code
        try:
            await asyncio.wait_for(socket.recv(), 5)
        except websockets.ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd else None
        return "open"

    outcome = asyncio.run(scenario())
    assert outcome != "open"
    assert outcome in (403, 4401, 4403)
