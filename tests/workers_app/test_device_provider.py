"""The ``device`` provider and device eligibility (workers.md §5.4–§5.5), and what ``node.pair.remove``
does to the placements on a removed node: they fail before the method answers, with the node's
absence in the reason; other sessions are untouched."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.utils import timezone

from devices_app.models import PairedDevice
from gateway.models import GatewayConnection
from workers_app.models import Placement, WorkerEnvironment
from workers_app.nodes import hosts as node_hosts
from workers_app.nodes.device_provider import DeviceProvider, device_lease_id, device_profile
from workers_app.nodes.inventory import Declaration
from workers_app.providers import WorkerProviderError
from workers_app.runtimes import worker_runtimes
from workers_app.services import dispatch, reclaim
from workers_app.services.placements import Actor
from workers_app.services.recovery import workers_node_removed

from .test_placement_store import ENV, dispatch_to_active, dispatch_to_active_on, make_session
from .test_rpc import NODE, paired_node

pytestmark = pytest.mark.django_db

PROFILE = device_profile(NODE)
# The test node connects as OpenClaw's node host does (``node-host``, no private commands): it also needs the
# environment session to be eligible.
HOSTING = {
    "enabled": True,
    "capacity": {"total": 2, "available": 2},
    "capturedExecPolicy": True,
    "environmentSession": 1,
}


def declare(worker_host: dict | None, *, retired: bool = False) -> None:
    connection = GatewayConnection.objects.get(node_id=NODE)
    declaration = Declaration(["node-worker-supervisor-v6"], worker_host, retired=retired)
    node_hosts.node_host_declare(node_id=NODE, conn_id=str(connection.conn_id), declaration=declaration)


def test_a_device_lease_names_the_device_and_the_operation_by_their_hashes():
    lease = device_lease_id(NODE, "op-1")
    device_hash = hashlib.sha256(NODE.encode()).hexdigest()
    assert lease == f"device:{device_hash}:{hashlib.sha256(b'op-1').hexdigest()[:32]}"


def test_provision_needs_a_connected_paired_node():
    provider = DeviceProvider()
    with pytest.raises(WorkerProviderError, match=f"device worker is not a paired node host: {NODE}"):
        provider.provision(PROFILE, "op")
    paired_node(connected=False)
    with pytest.raises(WorkerProviderError, match="device worker node is not connected"):
        provider.provision(PROFILE, "op")


def test_provision_on_a_connected_node_leases_its_machine():
    paired_node(connected=True)
    lease = DeviceProvider().provision(PROFILE, "op")
    assert (lease.lease_id, lease.node_device_id, lease.shared_host) == (device_lease_id(NODE, "op"), NODE, True)


def test_inspect_follows_pairing_connection_and_dormancy():
    provider = DeviceProvider()
    assert provider.inspect("device:x", PROFILE).status == "unknown"  # not a paired node
    device = paired_node(connected=False)
    assert provider.inspect("device:x", PROFILE).status == "dormant"  # never seen disconnecting
    PairedDevice.objects.filter(pk=device.pk).update(last_disconnected_at=timezone.now() - timedelta(days=13))
    assert provider.inspect("device:x", PROFILE).status == "dormant"
    PairedDevice.objects.filter(pk=device.pk).update(last_disconnected_at=timezone.now() - timedelta(days=15))
    assert provider.inspect("device:x", PROFILE).status == "unknown"


def test_inspect_of_a_connected_node_is_active_on_a_shared_host():
    paired_node(connected=True)
    inspection = DeviceProvider().inspect("device:x", PROFILE)
    assert (inspection.status, inspection.shared_host) == ("active", True)


def test_destroy_cannot_be_proven_while_the_node_is_away():
    paired_node(connected=False)
    with pytest.raises(WorkerProviderError) as pending:
        DeviceProvider().destroy("device:x", PROFILE)
    assert pending.value.code == "cleanup_indeterminate"
    assert pending.value.message == f"device worker node is not connected: {NODE}; reconnect it before retrying"


def test_eligibility_follows_the_connection_s_declaration(monkeypatch):
    paired_node(connected=True)
    cannot_host = f"device node {NODE} is connected but cannot host sessions"
    assert dispatch.device_ineligibility(NODE).startswith(cannot_host)  # nothing declared
    declare({"enabled": False})
    assert dispatch.device_ineligibility(NODE).startswith(cannot_host)
    declare(None, retired=True)
    assert dispatch.device_ineligibility(NODE).startswith(f"device worker node {NODE} requires an update")
    declare({**HOSTING, "capacity": {"total": 2, "available": 0}})
    monkeypatch.setattr(worker_runtimes, "_by_provider", {"device": object()})
    assert dispatch.device_ineligibility(NODE) == (
        f"device worker is at capacity (all worker slots in use): {NODE}; "
        "stop an existing worker environment or retry when a slot is free"
    )
    declare({**HOSTING, "capacity": {"total": 2, "available": 0, "reclaimableIdle": 1}})
    assert dispatch.device_ineligibility(NODE) is None  # an idle worker can be reclaimed


def test_removing_a_node_fails_the_placements_on_it_before_answering_and_only_those():
    paired_node(connected=False)
    placed = make_session("agent:main:on-node")
    dispatch_to_active(placed)
    WorkerEnvironment.objects.filter(pk=ENV).update(
        provider_id="device", profile_id=f"device:{NODE}", profile_snapshot=PROFILE.snapshot(), node_device_id=NODE
    )
    elsewhere = make_session("agent:main:elsewhere")
    dispatch_to_active_on(elsewhere, "worker:other")
    untouched = Placement.objects.values().get(pk=elsewhere.pk)
    PairedDevice.objects.filter(device_id=NODE).delete()  # what node.pair.remove did first

    workers_node_removed(NODE)

    failed = Placement.objects.get(pk=placed.pk)
    assert failed.state == "failed"
    assert failed.terminal_reason.startswith("cloud worker disappeared: Worker provider no longer recognizes the lease")
    assert "not connected" in failed.recovery_error
    environment = WorkerEnvironment.objects.get(pk=ENV)
    # The node cannot confirm its worker stopped: the teardown stays pending (the sweep retries it).
    assert environment.destroy_requested_at_ms is not None and environment.teardown_terminal_state == "failed"
    assert Placement.objects.values().get(pk=elsewhere.pk) == untouched


def test_a_removed_node_ends_its_environments_and_its_sessions_continue_on_the_gateway_when_asked():
    """workers.md §5.4: the removed node cannot be told to stop (it is not connected), but its credentials
    are revoked, so its environments end ``failed`` with that reason and nothing is left pending."""
    paired_node(connected=False)
    session = make_session("agent:main:on-node")
    dispatch_to_active(session)
    WorkerEnvironment.objects.filter(pk=ENV).update(
        provider_id="device", profile_id=f"device:{NODE}", profile_snapshot=PROFILE.snapshot(), node_device_id=NODE
    )
    PairedDevice.objects.filter(device_id=NODE).delete()
    workers_node_removed(NODE)
    failed = Placement.objects.get(pk=session.pk)
    environment = WorkerEnvironment.objects.get(pk=ENV)

    assert failed.state == "failed"
    assert failed.terminal_reason.startswith("cloud worker disappeared: Worker provider no longer recognizes the lease")
    assert f"device worker node is not connected: {NODE}; reconnect it before retrying" in failed.recovery_error
    assert environment.state == "failed"
    assert f"environment destroy: device worker node is not connected: {NODE}" in environment.last_error

    recovered = reclaim.reclaim(
        session=session, recover_to_gateway_generation=failed.generation, actor=Actor("operator")
    )
    assert (recovered.state, recovered.terminal_reason, recovered.recovery_error) == ("local", None, None)
