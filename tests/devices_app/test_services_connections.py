"""Connection rows: writes that race with pairing changes take their locks in one order."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.db import connection, transaction
from django.utils import timezone

from devices_app.models import PairedDevice
from devices_app.services import connections as device_connections
from devices_app.services import pairing
from gateway.audit import Actor
from gateway.exceptions import NotPaired
from gateway.models import GatewayConnection
from gateway.services import connections
from tests.support.connections import connection_record

NODE_ID = "n" * 64
BOOT_ID = str(uuid.uuid4())
CONN_IDS = {name: str(uuid.uuid4()) for name in ("conn-1", "conn-2", "conn-3")}


def register_node_connection(conn_id: str) -> None:
    device_connections.connection_register(
        record=connection_record(
            conn_id=CONN_IDS[conn_id],
            boot_id=BOOT_ID,
            channel_name=f"channel.{conn_id}",
            role="node",
            auth_method="device-token",
            device_id=NODE_ID,
            node_id=NODE_ID,
            client_id="node-host",
            client_mode="node",
            display_name="worker",
        )
    )


@pytest.fixture
def connected_node():
    connections.process_register(boot_id=BOOT_ID)
    PairedDevice.objects.create(device_id=NODE_ID, public_key="pk", roles=["node"], approved_at=timezone.now())
    register_node_connection("conn-1")


def in_thread(target) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as error:  # reported to the test, which asserts there were none
            errors.append(error)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def race_with_role_removal(other) -> tuple[list[BaseException], list[BaseException]]:
    """Run ``other`` while ``node_remove`` holds the device row it locks first, and let the removal go
    on once ``other`` had time to reach whatever lock it blocks on. Returns both sides' errors."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's; SQLite serializes whole transactions")
    device_locked, other_started = threading.Event(), threading.Event()

    def remove_role_slowly() -> None:
        with transaction.atomic():
            list(PairedDevice.objects.select_for_update(no_key=True).filter(device_id=NODE_ID))
            device_locked.set()
            other_started.wait(5)
            time.sleep(0.3)
            pairing.node_remove(node_id=NODE_ID, actor=Actor.system("test"))

    def run_other() -> None:
        other_started.set()
        other()

    remover, remover_errors = in_thread(remove_role_slowly)
    assert device_locked.wait(5)
    racing, other_errors = in_thread(run_other)
    remover.join(15)
    racing.join(15)
    return remover_errors, other_errors


@pytest.mark.django_db(transaction=True)
def test_a_node_disconnecting_while_its_role_is_removed_waits_instead_of_deadlocking(connected_node):
    """``node_remove`` locks the device row, then deletes the node's connection rows. A disconnect of
    that node in between must wait on the device row too; had it deleted its connection row first,
    the two transactions would each hold what the other needs (PostgreSQL: deadlock detected)."""
    remover_errors, disconnect_errors = race_with_role_removal(
        lambda: device_connections.connection_unregister(conn_id=CONN_IDS["conn-1"])
    )

    assert remover_errors == [] and disconnect_errors == []
    assert not GatewayConnection.objects.exists()
    assert not PairedDevice.objects.filter(device_id=NODE_ID).exists()


@pytest.mark.django_db(transaction=True)
def test_a_node_reconnecting_while_its_role_is_removed_is_refused_not_left_routable(connected_node):
    """A reconnect that passed its pairing check just before the removal waits for it on the device
    row, then finds the pairing gone: refused, and no connection row of the removed node is left."""
    remover_errors, reconnect_errors = race_with_role_removal(lambda: register_node_connection("conn-2"))

    assert remover_errors == []
    assert [type(error) for error in reconnect_errors] == [NotPaired]
    assert "pairing removed" in str(reconnect_errors[0])
    assert not GatewayConnection.objects.exists()


@pytest.mark.django_db
def test_a_connection_of_a_device_without_the_role_is_refused(connected_node):
    pairing.node_remove(node_id=NODE_ID, actor=Actor.system("test"))
    with pytest.raises(NotPaired, match="pairing removed while connecting"):
        register_node_connection("conn-3")
    assert not GatewayConnection.objects.exists()


def register_operator_connection(conn_id: str, device_id: str = NODE_ID) -> None:
    device_connections.connection_register(
        record=connection_record(
            conn_id=CONN_IDS[conn_id],
            boot_id=BOOT_ID,
            channel_name=f"channel.{conn_id}",
            role="operator",
            auth_method="token",
            device_id=device_id,
            client_id="cli",
            client_mode="cli",
        )
    )


@pytest.mark.django_db(transaction=True)
def test_an_operator_connection_outside_a_transaction_registers_touches_its_device_and_unregisters(connected_node):
    """The operators' write path of its own (one statement on PostgreSQL): the row, the device's
    last-connected time, and on unregister the row gone and the device marked disconnected."""
    PairedDevice.objects.filter(device_id=NODE_ID).update(roles=["node", "operator"])
    register_operator_connection("conn-2")

    row = GatewayConnection.objects.get(conn_id=CONN_IDS["conn-2"])
    assert (row.role, row.device_id, row.process_id, row.scopes) == ("operator", NODE_ID, uuid.UUID(BOOT_ID), [])
    device = PairedDevice.objects.get(device_id=NODE_ID)
    assert device.last_seen_reason == "connect" and device.last_connected_at is not None

    assert device_connections.connection_unregister(conn_id=CONN_IDS["conn-2"]) is True
    assert device_connections.connection_unregister(conn_id=CONN_IDS["conn-2"]) is False
    assert not GatewayConnection.objects.filter(conn_id=CONN_IDS["conn-2"]).exists()
    assert PairedDevice.objects.get(device_id=NODE_ID).last_seen_reason == "disconnect"


@pytest.mark.django_db(transaction=True)
def test_an_operator_connection_of_a_device_without_the_operator_role_is_refused(connected_node):
    with pytest.raises(NotPaired, match="pairing removed while connecting"):
        register_operator_connection("conn-2")
    assert list(GatewayConnection.objects.values_list("role", flat=True)) == ["node"]
    assert PairedDevice.objects.get(device_id=NODE_ID).last_seen_reason == "connect"


@pytest.mark.django_db(transaction=True)
def test_an_operator_connection_registers_again_after_its_process_row_was_swept(connected_node):
    connections.process_register(boot_id=BOOT_ID)
    PairedDevice.objects.filter(device_id=NODE_ID).update(roles=["node", "operator"])
    device_connections.process_unregister(boot_id=BOOT_ID)

    register_operator_connection("conn-2")

    assert GatewayConnection.objects.filter(conn_id=CONN_IDS["conn-2"], process_id=BOOT_ID).exists()
