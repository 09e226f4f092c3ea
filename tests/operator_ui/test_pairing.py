"""The console's pairing page: operator devices' pairing requests approved or rejected, paired devices
removed, their tokens rotated (the new secret shown once) or revoked, each through the service behind the
RPC, audited as the logged-in staff user, with the service's refusal shown when the state moved on.
Staff only; a GET never changes anything; POSTs need the CSRF token. Live updates come over the
console's socket (``?topics=pairing``), for staff only."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from channels.layers import InMemoryChannelLayer, channel_layers
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from devices_app.models import DevicePairingRequest, DeviceToken, PairedDevice, PairingStatus
from devices_app.services import pairing, tokens
from gateway import events
from gateway import scopes as sc
from gateway.audit import Actor
from gateway.auth import hash_device_token
from gateway.models import AuditLog
from operator_ui.consumers import SESSIONS_GROUP, ConsoleConsumer
from tests.devices_app.test_services_pairing import claim
from tests.support.operators import operator_user

pytestmark = pytest.mark.django_db

LAPTOP = "a" * 64
PHONE = "b" * 64
NODE = "c" * 64
TS = {"decision": "approved", "ts": 1}


@pytest.fixture
def staff_client(client, django_user_model):
    client.force_login(operator_user("boss", sc.ADMIN, is_staff=True))
    return client


def operator_request(device_id: str = LAPTOP) -> DevicePairingRequest:
    """An operator device (no shared secret) asking to pair, as the handshake records it."""
    request, _created = pairing.pairing_request_ensure(
        claim=pairing.PairingClaim(
            device_id=device_id,
            public_key="pk",
            role=sc.ROLE_OPERATOR,
            scopes=[sc.READ, sc.WRITE],
            reason="not-paired",
            is_repair=False,
            display_name="Ada's laptop",
            client_id="cli",
            client_mode="cli",
            platform="linux",
        )
    )
    return request


def node_request(device_id: str = NODE) -> DevicePairingRequest:
    request, _created = pairing.pairing_request_ensure(claim=claim(device_id, display_name="build-box"))
    return request


def paired(device_id: str = LAPTOP) -> PairedDevice:
    """An operator device approved and holding its operator token (secret ``old-<device id>``)."""
    device = pairing.pairing_request_approve(
        request_id=str(operator_request(device_id).request_id), actor=Actor.system()
    )
    DeviceToken.objects.create(
        device=device, role=sc.ROLE_OPERATOR, token_hash=hash_device_token(f"old-{device_id}"), scopes=[sc.READ]
    )
    return device


def token_of(device_id: str = LAPTOP, role: str = sc.ROLE_OPERATOR) -> DeviceToken:
    return DeviceToken.objects.get(device_id=device_id, role=role)


def url(name: str, **kwargs) -> str:
    return reverse(f"ui:{name}", kwargs=kwargs)


def decide(client, request: DevicePairingRequest, decision: str):
    return client.post(url("pairing-request", request_id=str(request.request_id), decision=decision), follow=True)


def messages_of(response) -> list[str]:
    return [message.message for message in get_messages(response.wsgi_request)]


# --- the page -------------------------------------------------------------------------------


def test_the_page_lists_operator_requests_and_paired_devices_with_their_tokens(staff_client):
    operator_request(PHONE)
    node_request()
    device = paired()
    DeviceToken.objects.filter(pk=token_of().pk).update(last_used_at=device.approved_at)

    response = staff_client.get(url("pairing"))

    assert response.status_code == 200
    page = response.content.decode()
    pending_part, devices_part = page.split('id="devices-title"')
    assert PHONE in pending_part and "Approve" in pending_part and "operator.read, operator.write" in pending_part
    assert NODE not in page  # a node's request is decided on the nodes page, which the page links to
    assert "1 node pairing request waits on the Nodes page." in pending_part
    assert LAPTOP in devices_part and "Ada&#x27;s laptop" in devices_part
    assert "operator.read, operator.write" in devices_part  # the approved scopes
    assert "active" in devices_part and "last used" in devices_part and "offline" in devices_part
    assert url("pairing-token-rotate", device_id=LAPTOP, role="operator") in devices_part
    assert url("pairing-token-revoke", device_id=LAPTOP, role="operator") in devices_part
    assert url("pairing-device-remove", device_id=LAPTOP) in devices_part
    assert response.context["nav"] == "pairing"


def test_a_revoked_token_and_a_role_without_a_token_show_their_state(staff_client):
    device = paired()
    tokens.device_token_revoke(device_id=LAPTOP, role=sc.ROLE_OPERATOR, actor=Actor.system())
    node = pairing.pairing_request_approve(
        request_id=str(node_request(LAPTOP).request_id), actor=Actor.system(), role=sc.ROLE_NODE
    )
    assert node.pk == device.pk and node.roles == [sc.ROLE_NODE, sc.ROLE_OPERATOR]

    page = staff_client.get(url("pairing")).content.decode()

    assert "revoked" in page and "not issued yet" in page and "Issue token…" in page
    # Revoking is offered for active tokens only.
    assert url("pairing-token-revoke", device_id=LAPTOP, role="operator") not in page
    assert url("pairing-token-revoke", device_id=LAPTOP, role="node") not in page


def test_an_empty_page_says_how_devices_get_here(staff_client):
    page = staff_client.get(url("pairing")).content.decode()

    assert "No device is waiting for approval." in page
    assert "No paired devices yet." in page
    assert "Nodes ask to pair on the" in page


def test_the_nav_links_the_page_for_staff_only(staff_client, django_user_model):
    operator = Client()
    operator.force_login(operator_user("ops", sc.WRITE))

    assert url("pairing") in staff_client.get(url("sessions")).content.decode()
    assert url("pairing") not in operator.get(url("sessions")).content.decode()


def test_the_page_asks_its_socket_for_the_pairing_events(staff_client):
    page = staff_client.get(url("pairing")).content.decode()

    assert 'data-live-topics="pairing"' in page
    assert 'data-live-events="device.pair.requested device.pair.resolved node.pair.requested' in page
    assert 'data-live-region="pending"' in page and 'data-live-region="devices"' in page


def test_the_page_costs_the_same_queries_for_few_and_many_devices(staff_client, django_assert_max_num_queries):
    paired(f"{1:064x}")
    with django_assert_max_num_queries(10) as few:
        staff_client.get(url("pairing"))
    for n in range(2, 30):
        paired(f"{n:064x}")
        operator_request(f"{n + 100:064x}")

    with django_assert_max_num_queries(len(few.captured_queries)):
        response = staff_client.get(url("pairing"))

    assert len(response.context["devices"]) == 29
    assert len(response.context["pending"]) == 28


# --- pairing requests -----------------------------------------------------------------------


def test_approving_a_device_pairs_it_and_is_audited_as_the_user(staff_client):
    request = operator_request()

    response = decide(staff_client, request, "approve")

    assert messages_of(response) == [f"Approved device Ada's laptop ({LAPTOP})."]
    device = PairedDevice.objects.get(device_id=LAPTOP)
    assert device.roles == [sc.ROLE_OPERATOR]
    assert device.approved_scopes == [sc.READ, sc.WRITE]
    row = AuditLog.objects.get(action="device.pair.approve")
    assert (row.actor, row.actor_user.username, row.target_id) == ("user:boss", "boss", LAPTOP)
    assert row.data["before"] == "unpaired"
    assert row.data["after"] == {"roles": [sc.ROLE_OPERATOR], "scopes": [sc.READ, sc.WRITE]}


def test_rejecting_leaves_the_device_unpaired_and_a_second_decision_shows_the_services_refusal(staff_client):
    request = operator_request()

    rejected = decide(staff_client, request, "reject")
    again = decide(staff_client, request, "approve")

    assert messages_of(rejected) == [f"Rejected the pairing request of device {LAPTOP}."]
    assert messages_of(again) == ["unknown requestId"]
    assert DevicePairingRequest.objects.get(pk=request.pk).status == PairingStatus.REJECTED
    assert not PairedDevice.objects.exists()
    assert list(AuditLog.objects.values_list("action", flat=True)) == ["device.pair.reject"]


def test_a_request_approved_meanwhile_elsewhere_is_refused_with_the_services_message(staff_client):
    request = operator_request()
    pairing.pairing_request_approve(request_id=str(request.request_id), actor=Actor.system("cli"))

    response = decide(staff_client, request, "reject")

    assert messages_of(response) == ["unknown requestId"]
    assert DevicePairingRequest.objects.get(pk=request.pk).status == PairingStatus.APPROVED
    assert PairedDevice.objects.filter(device_id=LAPTOP).exists()
    assert not AuditLog.objects.filter(actor="user:boss").exists()


def test_a_node_request_is_not_decided_here(staff_client):
    request = node_request()

    response = decide(staff_client, request, "approve")

    assert messages_of(response) == ["unknown requestId"]
    assert DevicePairingRequest.objects.get(pk=request.pk).status == PairingStatus.PENDING
    assert not PairedDevice.objects.exists()


def test_a_malformed_request_id_is_refused_and_an_unknown_decision_is_404(staff_client):
    request = operator_request()

    malformed = staff_client.post(url("pairing-request", request_id="x" * 300, decision="approve"), follow=True)
    unknown = staff_client.post(url("pairing-request", request_id=str(request.request_id), decision="maybe"))

    assert messages_of(malformed) and "requestId" in messages_of(malformed)[0]
    assert unknown.status_code == 404
    assert DevicePairingRequest.objects.get(pk=request.pk).status == PairingStatus.PENDING


# --- removing a device ------------------------------------------------------------------------


def test_removing_a_device_asks_first_then_removes_it_with_its_tokens(staff_client):
    paired()
    confirm_url = url("pairing-device-remove", device_id=LAPTOP)

    confirmation = staff_client.get(confirm_url)
    assert confirmation.status_code == 200
    assert "Remove device" in confirmation.content.decode() and "Remove node" not in confirmation.content.decode()
    assert PairedDevice.objects.filter(device_id=LAPTOP).exists()  # a GET changes nothing

    removed = staff_client.post(confirm_url, follow=True)

    assert messages_of(removed) == [f"Removed device {LAPTOP}."]
    assert not PairedDevice.objects.filter(device_id=LAPTOP).exists()
    assert not DeviceToken.objects.filter(device_id=LAPTOP).exists()
    row = AuditLog.objects.get(action="device.pair.remove")
    assert (row.actor, row.actor_user.username, row.target_id) == ("user:boss", "boss", LAPTOP)
    assert row.data == {"before": {"roles": [sc.ROLE_OPERATOR], "scopes": [sc.READ, sc.WRITE]}, "after": "removed"}


def test_a_device_with_a_node_role_points_to_the_node_removal(staff_client):
    pairing.pairing_request_approve(request_id=str(node_request().request_id), actor=Actor.system(), role="node")

    page = staff_client.get(url("pairing-device-remove", device_id=NODE)).content.decode()

    assert url("node-remove", node_id=NODE) in page


def test_removing_a_device_removed_meanwhile_shows_the_services_refusal(staff_client):
    paired()
    confirmation = staff_client.get(url("pairing-device-remove", device_id=LAPTOP))
    assert confirmation.status_code == 200
    pairing.paired_device_remove(device_id=LAPTOP, actor=Actor.system("cli"))

    response = staff_client.post(url("pairing-device-remove", device_id=LAPTOP), follow=True)

    assert messages_of(response) == ["unknown deviceId"]
    assert staff_client.get(url("pairing-device-remove", device_id=LAPTOP)).status_code == 404
    assert not AuditLog.objects.filter(actor="user:boss").exists()


# --- revoking a token -----------------------------------------------------------------------


def test_revoking_a_token_asks_first_then_revokes_it(staff_client):
    paired()
    revoke_url = url("pairing-token-revoke", device_id=LAPTOP, role="operator")

    confirmation = staff_client.get(revoke_url)
    assert confirmation.status_code == 200
    assert "Revoke the operator token of Ada&#x27;s laptop?" in confirmation.content.decode()
    assert token_of().revoked_at is None  # a GET changes nothing

    revoked = staff_client.post(revoke_url, follow=True)

    assert messages_of(revoked) == [f"Revoked the operator token of device {LAPTOP}."]
    assert token_of().revoked_at is not None
    row = AuditLog.objects.get(action="device.token.revoke")
    assert (row.actor, row.actor_user.username, row.target_id) == ("user:boss", "boss", LAPTOP)
    assert row.data == {"role": "operator", "before": "active", "after": "revoked"}


def test_revoking_a_token_revoked_meanwhile_says_so_and_changes_nothing(staff_client):
    paired()
    revoke_url = url("pairing-token-revoke", device_id=LAPTOP, role="operator")
    tokens.device_token_revoke(device_id=LAPTOP, role=sc.ROLE_OPERATOR, actor=Actor.system("cli"))
    revoked_at = token_of().revoked_at

    response = staff_client.post(revoke_url, follow=True)
    confirmation = staff_client.get(revoke_url).content.decode()

    assert messages_of(response) == [f"The operator token of device {LAPTOP} was already revoked."]
    assert token_of().revoked_at == revoked_at
    assert not AuditLog.objects.filter(actor="user:boss").exists()
    assert "already revoked" in confirmation and 'class="button-danger"' not in confirmation


def test_revoking_the_token_of_a_device_removed_meanwhile_shows_the_services_refusal(staff_client):
    paired()
    pairing.paired_device_remove(device_id=LAPTOP, actor=Actor.system("cli"))

    response = staff_client.post(url("pairing-token-revoke", device_id=LAPTOP, role="operator"), follow=True)

    assert messages_of(response) == ["unknown device token"]
    assert staff_client.get(url("pairing-token-revoke", device_id=LAPTOP, role="operator")).status_code == 404


# --- rotating a token -----------------------------------------------------------------------


def test_rotating_a_token_asks_first_then_shows_the_new_secret_once(staff_client):
    paired()
    rotate_url = url("pairing-token-rotate", device_id=LAPTOP, role="operator")
    old_hash = token_of().token_hash

    confirmation = staff_client.get(rotate_url)
    assert confirmation.status_code == 200
    assert "scopes of the new token: operator.read, operator.write" in confirmation.content.decode()
    assert token_of().token_hash == old_hash  # a GET changes nothing

    response = staff_client.post(rotate_url)

    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    page = response.content.decode()
    assert "Copy it now: it is not shown again." in page
    secret = re.search(r'id="new-token"[^>]*>([^<]+)</textarea>', page).group(1)
    record = tokens.device_token_verify(device_id=LAPTOP, role=sc.ROLE_OPERATOR, token=secret)
    assert record.scopes == [sc.READ, sc.WRITE] and record.revoked_at is None and record.rotated_at is not None
    with pytest.raises(tokens.DeviceTokenRejected):
        tokens.device_token_verify(device_id=LAPTOP, role=sc.ROLE_OPERATOR, token=f"old-{LAPTOP}")
    row = AuditLog.objects.get(action="device.token.rotate")
    assert (row.actor, row.actor_user.username, row.target_id) == ("user:boss", "boss", LAPTOP)
    assert row.data == {
        "role": "operator",
        "scopes": [sc.READ, sc.WRITE],
        "before": "active",
        "after": "active",
        "tokenDelivery": "shown-to-operator",
    }
    assert secret not in json.dumps(row.data)
    # Shown once: no other page carries it.
    assert secret not in staff_client.get(url("pairing")).content.decode()
    assert secret not in staff_client.get(rotate_url).content.decode()


def test_issuing_a_token_for_a_role_without_one(staff_client):
    pairing.pairing_request_approve(request_id=str(node_request().request_id), actor=Actor.system(), role="node")

    response = staff_client.post(url("pairing-token-rotate", device_id=NODE, role="node"))

    secret = re.search(r'id="new-token"[^>]*>([^<]+)</textarea>', response.content.decode()).group(1)
    assert tokens.device_token_verify(device_id=NODE, role=sc.ROLE_NODE, token=secret).scopes == []
    assert AuditLog.objects.get(action="device.token.rotate").data["before"] == "none"


@pytest.mark.parametrize(
    ("moved_on", "refusal"),
    [("removed", "unknown deviceId"), ("lost the role", "device token rotation denied")],
)
def test_rotating_when_the_device_moved_on_shows_the_services_refusal(staff_client, moved_on, refusal):
    pairing.pairing_request_approve(request_id=str(node_request().request_id), actor=Actor.system(), role="node")
    if moved_on == "removed":
        pairing.paired_device_remove(device_id=NODE, actor=Actor.system("cli"))
    else:
        paired(NODE)  # an operator too, then the node role withdrawn
        pairing.node_remove(node_id=NODE, actor=Actor.system("cli"))
    audit_rows = AuditLog.objects.count()

    response = staff_client.post(url("pairing-token-rotate", device_id=NODE, role="node"), follow=True)

    assert messages_of(response) == [refusal]
    assert response.redirect_chain == [(url("pairing"), 302)]
    assert not DeviceToken.objects.filter(device_id=NODE, role=sc.ROLE_NODE).exists()
    assert AuditLog.objects.count() == audit_rows


@pytest.mark.parametrize("name", ["pairing-token-rotate", "pairing-token-revoke"])
def test_an_unknown_role_or_a_malformed_device_id_is_404_and_changes_nothing(staff_client, name):
    paired()

    assert staff_client.post(url(name, device_id=LAPTOP, role="superuser")).status_code == 404
    assert staff_client.get(url(name, device_id="x" * 300, role="operator")).status_code == 404
    assert staff_client.get(url(name, device_id=PHONE, role="operator")).status_code == 404
    assert token_of().revoked_at is None and not AuditLog.objects.filter(actor="user:boss").exists()


# --- who may, and how ---------------------------------------------------------------------------


def _every_page_and_action():
    return [
        ("get", url("pairing")),
        ("get", url("pairing-device-remove", device_id=LAPTOP)),
        ("get", url("pairing-token-revoke", device_id=LAPTOP, role="operator")),
        ("get", url("pairing-token-rotate", device_id=LAPTOP, role="operator")),
        ("post", url("pairing-device-remove", device_id=LAPTOP)),
        ("post", url("pairing-token-revoke", device_id=LAPTOP, role="operator")),
        ("post", url("pairing-token-rotate", device_id=LAPTOP, role="operator")),
    ]


def _nothing_changed(old_hash: str, request: DevicePairingRequest) -> None:
    assert token_of().token_hash == old_hash and token_of().revoked_at is None
    assert DevicePairingRequest.objects.get(pk=request.pk).status == PairingStatus.PENDING
    assert not AuditLog.objects.exclude(actor="gateway").exists()


def _refused_everywhere(client, check) -> None:
    """Every page and action, as ``client``: each answer passes ``check``, and nothing changes."""
    paired()
    request = operator_request(PHONE)
    old_hash = token_of().token_hash
    calls = [
        *_every_page_and_action(),
        ("post", url("pairing-request", request_id=request.request_id, decision="approve")),
    ]

    for method, path in calls:
        check(getattr(client, method)(path), path)

    _nothing_changed(old_hash, request)


def test_a_user_without_staff_status_is_refused_everything(operator_client):
    def forbidden(response, path):
        assert response.status_code == 403, path
        assert "new-token" not in response.content.decode()

    _refused_everywhere(operator_client, forbidden)


def test_an_anonymous_visitor_is_sent_to_the_login_page(client):
    def to_login(response, path):
        assert response.status_code == 302, path
        assert response["Location"].startswith(url("login")), path

    _refused_everywhere(client, to_login)


def test_posts_without_the_csrf_token_are_refused(django_user_model):
    paired()
    request = operator_request(PHONE)
    old_hash = token_of().token_hash
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator_user("boss", sc.ADMIN, is_staff=True))
    posts = [path for method, path in _every_page_and_action() if method == "post"]
    posts.append(url("pairing-request", request_id=request.request_id, decision="approve"))

    for path in posts:
        assert client.post(path).status_code == 403, path

    _nothing_changed(old_hash, request)
    assert PairedDevice.objects.filter(device_id=LAPTOP).exists()


def test_the_confirmation_forms_carry_the_csrf_token(staff_client):
    paired()
    for method, path in _every_page_and_action():
        if method == "get" and path != url("pairing"):
            assert 'name="csrfmiddlewaretoken"' in staff_client.get(path).content.decode(), path


def test_decisions_are_post_only(staff_client):
    request = operator_request()

    response = staff_client.get(url("pairing-request", request_id=str(request.request_id), decision="approve"))

    assert response.status_code == 405
    assert DevicePairingRequest.objects.get(pk=request.pk).status == PairingStatus.PENDING
    assert staff_client.put(url("pairing-device-remove", device_id=LAPTOP)).status_code == 405


# --- live updates -------------------------------------------------------------------------------


@pytest.fixture
def layer(monkeypatch):
    layer = InMemoryChannelLayer()
    monkeypatch.setitem(channel_layers.backends, "default", layer)
    return layer


def _live(user: User, query: str = "") -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(ConsoleConsumer.as_asgi(), f"/ui/live/{query}")
    communicator.scope["user"] = user
    return communicator


@pytest.mark.django_db(transaction=True)
def test_the_pairing_topic_passes_the_pairing_events_on_to_a_user_who_may_pair(layer):
    staff = operator_user("boss", sc.ADMIN, is_staff=True)

    async def scenario():
        socket = _live(staff, "?topics=pairing")
        connected, _ = await socket.connect()
        assert connected
        payload = {"requestId": "r1", "deviceId": LAPTOP, **TS}
        await layer.group_send(events.BROADCAST_GROUP, events.broadcast_message("presence", {"presence": []}))
        await layer.group_send(events.BROADCAST_GROUP, events.broadcast_message("device.pair.resolved", payload))
        await layer.group_send(SESSIONS_GROUP, events.broadcast_message("sessions.changed", {"sessionKey": "k"}))
        frame = json.loads(await socket.receive_from())
        quiet = await socket.receive_nothing()
        await socket.disconnect()
        return frame, quiet

    frame, quiet = asyncio.run(scenario())

    assert frame == {"event": "device.pair.resolved", "payload": {"requestId": "r1", "deviceId": LAPTOP, **TS}}
    assert quiet  # neither presence nor the sessions' events on this socket


@pytest.mark.django_db(transaction=True)
def test_the_pairing_topic_is_not_joined_for_a_user_without_operator_pairing(layer):
    operator = operator_user("ops", sc.WRITE)

    async def scenario():
        socket = _live(operator, "?topics=pairing")
        connected, _ = await socket.connect()
        await layer.group_send(
            events.BROADCAST_GROUP, events.broadcast_message("device.pair.requested", {"deviceId": LAPTOP})
        )
        quiet = await socket.receive_nothing()
        await socket.disconnect()
        return connected, quiet

    connected, quiet = asyncio.run(scenario())

    assert connected and quiet


@pytest.mark.django_db(transaction=True)
def test_a_page_without_topics_still_gets_the_sessions_events_only(layer):
    staff = operator_user("boss", sc.ADMIN, is_staff=True)

    async def scenario():
        socket = _live(staff)
        await socket.connect()
        await layer.group_send(
            events.BROADCAST_GROUP, events.broadcast_message("device.pair.requested", {"deviceId": LAPTOP})
        )
        await layer.group_send(SESSIONS_GROUP, events.broadcast_message("sessions.changed", {"sessionKey": "k"}))
        frame = json.loads(await socket.receive_from())
        quiet = await socket.receive_nothing()
        await socket.disconnect()
        return frame, quiet

    frame, quiet = asyncio.run(scenario())

    assert frame == {"event": "sessions.changed", "payload": {"sessionKey": "k"}}
    assert quiet
