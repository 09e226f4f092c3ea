"""A connect's registration: a paired operator's reconnect is decided by its registration (one statement on
PostgreSQL, with the hello-ok presence snapshot in the same round trip); anything else is decided the slow way;
a connect that fails after registering leaves nothing routable."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from devices_app.models import DevicePairingRequest, DeviceToken, PairedDevice, PairingStatus
from devices_app.services import connections as device_connections
from devices_app.services import pairing
from gateway import hello, lifecycle, state
from gateway import scopes as sc
from gateway.audit import Actor
from gateway.conf import shared_token
from gateway.consumers import GatewayConsumer
from gateway.handshake import ConnectContext, HandshakeRejected, parse_connect
from gateway.hello import accept_connect, presence_snapshot
from gateway.models import GatewayConnection, GatewayProcess
from gateway.selectors import presence_snapshot_sql
from gateway.services import connections
from openclaw_client.client import ClientOptions, GatewayClient
from openclaw_client.identity import DeviceIdentity
from tests.support.clients import ALL_SCOPES
from tests.support.connections import connection_record

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "registration-test-token"


@pytest.fixture(autouse=True)
def gateway_token(settings):
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "TOKEN": TOKEN}
    shared_token.cache_clear()
    connections.process_register(boot_id=state.BOOT_ID)
    yield
    shared_token.cache_clear()


def _connect_frame(identity: DeviceIdentity, nonce: str, scopes: list[str], **options) -> dict:
    client = GatewayClient(
        ClientOptions(url="ws://unused", token=TOKEN, scopes=list(scopes), identity=identity, **options)
    )
    return {"type": "req", "id": "c1", "method": "connect", "params": client.build_connect_params(nonce)}


def _connect(identity: DeviceIdentity, scopes: list[str] = ALL_SCOPES, **options) -> tuple[str, dict]:
    nonce, conn_id = str(uuid.uuid4()), str(uuid.uuid4())
    _id, params, protocol = parse_connect(_connect_frame(identity, nonce, scopes, **options))
    ctx = ConnectContext(
        conn_id=conn_id, boot_id=state.BOOT_ID, channel_name=f"test!{conn_id}", nonce=nonce, remote_ip="127.0.0.1"
    )
    _ctx, hello_ok, _snapshot = accept_connect(params, ctx, protocol)
    return conn_id, hello_ok


def _presence_device_ids(hello_ok: dict) -> list[str]:
    return [entry.get("deviceId") for entry in hello_ok["snapshot"]["presence"]]


def test_a_paired_operator_reconnects_in_one_statement_with_its_presence_snapshot():
    identity = DeviceIdentity.generate()
    _first, paired = _connect(identity)
    assert paired["auth"]["deviceToken"]  # the first connect paired the device and minted its token
    before = PairedDevice.objects.get(device_id=identity.device_id).last_connected_at

    with CaptureQueriesContext(connection) as queries:
        conn_id, hello_ok = _connect(identity)

    if connection.vendor == "postgresql":
        assert len(queries.captured_queries) == 1
    assert GatewayConnection.objects.filter(conn_id=conn_id, device_id=identity.device_id).exists()
    assert "deviceToken" not in hello_ok["auth"]  # nothing minted: the token on file covers the scopes
    assert hello_ok["auth"]["scopes"] == ALL_SCOPES
    assert identity.device_id in _presence_device_ids(hello_ok)
    assert hello_ok["snapshot"]["stateVersion"]["presence"] > paired["snapshot"]["stateVersion"]["presence"]
    assert PairedDevice.objects.get(device_id=identity.device_id).last_connected_at > before


def test_a_node_approved_while_its_connect_was_deciding_connects_and_leaves_no_new_request(monkeypatch):
    identity = DeviceIdentity.generate()
    node = dict(role="node", client_id="node-host", client_mode="node", commands=["system.run"])
    with pytest.raises(HandshakeRejected, match="pairing required"):
        _connect(identity, [], **node)
    request = DevicePairingRequest.objects.get(device_id=identity.device_id)
    ensure = pairing.pairing_request_ensure

    def approved_after_the_device_was_read(*, claim):
        # The operator's approval commits between the connect's read of the device and its request.
        pairing.pairing_request_approve(request_id=str(request.pk), actor=Actor.system("operator"))
        return ensure(claim=claim)

    monkeypatch.setattr(pairing, "pairing_request_ensure", approved_after_the_device_was_read)
    conn_id, hello_ok = _connect(identity, [], **node)

    assert hello_ok["auth"]["role"] == "node" and hello_ok["auth"]["deviceToken"]
    assert GatewayConnection.objects.get(conn_id=conn_id).commands == ["system.run"]
    assert not DevicePairingRequest.objects.filter(device_id=identity.device_id, status=PairingStatus.PENDING).exists()


def test_a_scope_upgrade_is_decided_the_slow_way_and_widens_the_pairing():
    identity = DeviceIdentity.generate()
    _connect(identity, [sc.READ])

    conn_id, hello_ok = _connect(identity, ALL_SCOPES)

    device = PairedDevice.objects.get(device_id=identity.device_id)
    assert sc.scopes_cover(device.approved_scopes, ALL_SCOPES)
    assert hello_ok["auth"]["deviceToken"]  # the token was widened: a new secret
    assert sc.scopes_cover(DeviceToken.objects.get(device=device, role="operator").scopes, ALL_SCOPES)
    assert GatewayConnection.objects.filter(conn_id=conn_id).exists()
    assert identity.device_id in _presence_device_ids(hello_ok)


def test_a_revoked_token_is_minted_again_on_reconnect():
    identity = DeviceIdentity.generate()
    _connect(identity)
    DeviceToken.objects.filter(device_id=identity.device_id).update(revoked_at=timezone.now())

    conn_id, hello_ok = _connect(identity)

    assert hello_ok["auth"]["deviceToken"]
    assert DeviceToken.objects.get(device_id=identity.device_id, role="operator").revoked_at is None
    assert GatewayConnection.objects.filter(conn_id=conn_id).exists()


def _operator_record(device_id: str, conn_id: str):
    return connection_record(
        conn_id=conn_id,
        boot_id=state.BOOT_ID,
        channel_name=f"test!{conn_id}",
        role="operator",
        scopes=list(ALL_SCOPES),
        auth_method="token",
        device_id=device_id,
    )


def test_a_declined_conditional_registration_writes_nothing():
    if connection.vendor != "postgresql":
        pytest.skip("the conditional registration is PostgreSQL's one-statement path")
    identity = DeviceIdentity.generate()
    _connect(identity)
    DeviceToken.objects.filter(device_id=identity.device_id).update(revoked_at=timezone.now())
    device_before = PairedDevice.objects.get(device_id=identity.device_id)
    _list, version_before = presence_snapshot()
    conn_id = str(uuid.uuid4())

    registered = device_connections.connection_register(
        record=_operator_record(identity.device_id, conn_id),
        then=presence_snapshot_sql(registered=conn_id),
        requires_scopes=list(ALL_SCOPES),
    )

    assert registered is None
    assert not GatewayConnection.objects.filter(conn_id=conn_id).exists()
    device_after = PairedDevice.objects.get(device_id=identity.device_id)
    assert device_after.last_connected_at == device_before.last_connected_at
    # The presence version was not raised for a connection that did not register.
    assert presence_snapshot()[1]["presence"] == version_before["presence"] + 1


def test_a_registration_whose_process_row_was_swept_registers_the_process_again():
    identity = DeviceIdentity.generate()
    _connect(identity)
    GatewayProcess.objects.filter(boot_id=state.BOOT_ID).delete()

    conn_id, hello_ok = _connect(identity)

    assert GatewayProcess.objects.filter(boot_id=state.BOOT_ID).exists()
    assert GatewayConnection.objects.filter(conn_id=conn_id).exists()
    assert identity.device_id in _presence_device_ids(hello_ok)
    # The failed first attempt left the database session usable, in autocommit as Django expects it.
    assert connection.get_autocommit() and not connection.in_atomic_block
    assert PairedDevice.objects.filter(device_id=identity.device_id).count() == 1


def test_a_presence_snapshot_raises_the_version_and_lists_what_registered_before_it():
    _list, first = presence_snapshot()
    identity = DeviceIdentity.generate()
    _connect(identity)

    entries, second = presence_snapshot()

    assert second["presence"] > first["presence"] + 1  # the connect raised it too
    assert identity.device_id in [entry.get("deviceId") for entry in entries]


class _Timer:
    def cancel(self) -> None:
        pass


class DataError(Exception):
    """Stands for a failure after the registration committed."""


async def _already_registered() -> None:
    """``lifecycle.ensure_process_registered`` for a test whose fixture registered the process: the real one would
    mark it registered for every later test of this worker too."""


class _DrivenConsumer:
    """A ``GatewayConsumer`` past its accept, fed frames directly: what it sends and how it closes are kept."""

    def __init__(self) -> None:
        consumer = self.consumer = GatewayConsumer()
        consumer.scope = {"type": "websocket", "headers": [], "client": ("127.0.0.1", 1)}
        consumer.phase = "handshake"
        consumer.conn_id = str(uuid.uuid4())
        consumer.nonce = str(uuid.uuid4())
        consumer.channel_name = f"test!{consumer.conn_id}"
        consumer.remote_ip = "127.0.0.1"
        consumer.handshake_timer = _Timer()
        consumer.ctx = None
        self.sent, self.closed = [], []

        async def send(text_data=None, bytes_data=None, close=False):
            self.sent.append(json.loads(text_data))

        async def close_socket(code=None, reason=None):
            self.closed.append((code, reason))

        consumer.send, consumer.close = send, close_socket

    def connect(self, identity: DeviceIdentity, scopes: list[str], **options) -> dict:
        frame = _connect_frame(identity, self.consumer.nonce, scopes, **options)
        try:
            asyncio.run(self.consumer.receive(text_data=json.dumps(frame)))
        finally:
            # Its loop is gone: it must not stay among this process's live connections (the next test's ticks).
            state.local_connections.discard(self.consumer)
        [response] = self.sent
        return response


def test_a_connect_that_fails_after_registering_leaves_no_connection(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise DataError("hello-ok could not be built")

    identity = DeviceIdentity.generate()
    _connect(identity)  # paired: the failing connect below is a reconnect
    monkeypatch.setattr(lifecycle, "ensure_process_registered", _already_registered)
    monkeypatch.setattr(hello, "build_hello", broken)
    driven = _DrivenConsumer()
    presence_changes = []
    monkeypatch.setattr("gateway.consumers.presence_changed", presence_changes.append)

    with caplog.at_level(logging.ERROR):
        response = driven.connect(identity, ALL_SCOPES)

    assert response["ok"] is False and response["error"]["message"].startswith("internal error; reference ")
    assert driven.closed == [(1011, response["error"]["message"])]
    assert not GatewayConnection.objects.filter(conn_id=driven.consumer.conn_id).exists()
    assert presence_changes == [None]  # it was routable for a moment: presence goes out again
    assert driven.consumer.ctx is None and driven.consumer.phase == "closed"


def test_a_node_approved_between_its_refusal_and_the_start_of_its_hold_is_accepted(monkeypatch, settings):
    """The approval's broadcast went out before the held connect listened for it: the hold decides the connect
    again once it listens, instead of refusing it when the hold ends."""
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "PAIRING_HOLD_MS": 2000}
    identity = DeviceIdentity.generate()
    node = dict(role="node", client_id="node-host", client_mode="node", commands=["system.run"])
    subscribe = lifecycle.ensure_broadcast_subscribed

    async def approved_before_the_hold_listens() -> None:
        def approve() -> None:
            # Once: the accepted connect subscribes too.
            request = DevicePairingRequest.objects.filter(
                device_id=identity.device_id, status=PairingStatus.PENDING
            ).first()
            if request is not None:
                pairing.pairing_request_approve(request_id=str(request.pk), actor=Actor.system("operator"))
            connection.close()  # this thread's

        await asyncio.to_thread(approve)
        await subscribe()

    monkeypatch.setattr(lifecycle, "ensure_broadcast_subscribed", approved_before_the_hold_listens)
    monkeypatch.setattr(lifecycle, "ensure_process_registered", _already_registered)
    monkeypatch.setattr("gateway.consumers.presence_changed", lambda presence: None)  # no broadcast from its loop
    driven = _DrivenConsumer()

    response = driven.connect(identity, [], **node)

    assert response["ok"] is True, response
    assert response["payload"]["auth"]["role"] == "node"
    assert GatewayConnection.objects.filter(conn_id=driven.consumer.conn_id).exists()
    assert driven.closed == []


def test_a_new_device_pairs_and_gets_its_token_in_one_transaction_without_savepoints():
    identity = DeviceIdentity.generate()

    with CaptureQueriesContext(connection) as queries:
        conn_id, hello_ok = _connect(identity)

    statements = [query["sql"] for query in queries.captured_queries]
    assert not any(sql.startswith(("SAVEPOINT", "RELEASE SAVEPOINT")) for sql in statements)
    # The new device row is inserted, not first looked for by an UPDATE of its primary key.
    [inserted_at] = [i for i, sql in enumerate(statements) if sql.startswith('INSERT INTO "gateway_paireddevice"')]
    assert not any(sql.startswith('UPDATE "gateway_paireddevice"') for sql in statements[:inserted_at])
    device = PairedDevice.objects.get(device_id=identity.device_id)
    token = DeviceToken.objects.get(device=device, role="operator")
    assert hello_ok["auth"]["deviceToken"] and token.revoked_at is None
    assert GatewayConnection.objects.filter(conn_id=conn_id).exists()


def test_a_silent_pairing_that_fails_midway_leaves_no_device_token_or_connection(monkeypatch):
    def audit_fails(*args, **kwargs):
        raise DataError("audit log unavailable")

    monkeypatch.setattr("devices_app.services.pairing.audit", audit_fails)
    identity = DeviceIdentity.generate()

    with pytest.raises(DataError):
        _connect(identity)

    assert not PairedDevice.objects.filter(device_id=identity.device_id).exists()
    assert not DeviceToken.objects.filter(device_id=identity.device_id).exists()
    assert not GatewayConnection.objects.filter(device_id=identity.device_id).exists()


def test_an_unpaired_node_is_told_to_keep_retrying_and_keeps_its_one_request_open():
    """OpenClaw's node host pauses its reconnects after a PAIRING_REQUIRED close ("waiting for operator action")
    unless the details say wait_then_retry / pauseReconnect false; its retries keep the same request open, so the
    operator approves the requestId it first saw, and the next retry connects."""
    identity = DeviceIdentity.generate()
    node = dict(role="node", client_id="node-host", client_mode="node", commands=["system.run"])
    with pytest.raises(HandshakeRejected) as first:
        _connect(identity, [], **node)
    details = first.value.error.details
    assert details["code"] == "PAIRING_REQUIRED" and details["reason"] == "not-paired"
    assert details["recommendedNextStep"] == "wait_then_retry"
    assert details["pauseReconnect"] is False and details["retryable"] is True
    request = DevicePairingRequest.objects.get(device_id=identity.device_id)
    DevicePairingRequest.objects.filter(pk=request.pk).update(expires_at=timezone.now() + timedelta(seconds=1))

    with pytest.raises(HandshakeRejected) as retry:
        _connect(identity, [], **node)

    assert retry.value.error.details["requestId"] == str(request.pk)
    refreshed = DevicePairingRequest.objects.get(pk=request.pk)
    assert refreshed.status == PairingStatus.PENDING
    assert refreshed.expires_at > timezone.now() + timedelta(seconds=60)  # refreshed by the retry
    pairing.pairing_request_approve(request_id=str(request.pk), actor=Actor.system("operator"))
    conn_id, hello_ok = _connect(identity, [], **node)
    assert hello_ok["auth"]["role"] == "node" and GatewayConnection.objects.filter(conn_id=conn_id).exists()
