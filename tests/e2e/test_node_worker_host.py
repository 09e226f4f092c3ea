"""A paired node as a worker host, over real sockets (workers.md §5.1–§5.2): the private worker commands
never show and cannot be invoked by an operator; ``node.runnerInventory.update`` is strict, hidden, scoped
to the declaring connection, and shows on the node's row (slots, update-required issue)."""

from __future__ import annotations

import asyncio

import pytest
from django.db import connections

from openclaw_client.client import GatewayError
from sessions_app.models import Session
from sessions_app.services.sessions import SessionSpec, session_create
from tests.support.clients import operator, paired_node
from workers_app.models import Placement, WorkerEnvironment
from workers_app.nodes.device_provider import device_profile
from workers_app.services import placements as store

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

WORKER_COMMANDS = ["worker.launch.v1", "worker.bundle.install.v1", "worker.workspace.retain.v1"]
HOST = {
    "protocolFeatures": ["node-worker-supervisor-v6"],
    "workerHost": {"enabled": True, "capacity": {"total": 2, "available": 2}, "capturedExecPolicy": True},
}
PRIVATE_REFUSAL = "node.invoke does not allow private node controls"
UPDATE_REQUIRED = {
    "code": "update-required",
    "action": "update-and-reconnect",
    "updateCommand": "openclaw update",
    "headlessReconnectCommand": "openclaw node restart",
}


async def _node(server, admin):
    return await paired_node(server, admin, commands=["echo", *WORKER_COMMANDS])


def row(listed: dict, node_id: str) -> dict:
    return next(node for node in listed["nodes"] if node["nodeId"] == node_id)


def test_private_worker_commands_are_hidden_and_refused(gateway):
    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        worker = await _node(gateway, admin)
        listed = await admin.request("node.list", {})
        described = await admin.request("node.describe", {"nodeId": worker.device_id})
        refusals = []
        for command in WORKER_COMMANDS:
            with pytest.raises(GatewayError) as refused:
                await admin.request(
                    "node.invoke", {"nodeId": worker.device_id, "command": command, "idempotencyKey": command}
                )
            refusals.append(refused.value)
        await worker.close()
        await admin.close()
        return worker.device_id, listed, described, refusals

    node_id, listed, described, refusals = asyncio.run(scenario())
    assert row(listed, node_id)["commands"] == ["echo"]
    assert described["commands"] == ["echo"]
    for command, refused in zip(WORKER_COMMANDS, refusals, strict=True):
        assert (refused.code, refused.message) == (
            "INVALID_REQUEST",
            "node.invoke does not allow private node controls",
        )
        assert refused.details == {"command": command}


def test_a_worker_host_declaration_shows_on_the_node_row_until_its_connection_ends(gateway):
    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        hello_methods = admin.hello["features"]["methods"]
        worker = await _node(gateway, admin)
        accepted = await worker.request("node.runnerInventory.update", HOST)
        hosting = row(await admin.request("node.list", {}), worker.device_id)
        await worker.close()
        await asyncio.sleep(0.3)
        gone = row(await admin.request("node.list", {}), worker.device_id)
        await admin.close()
        return worker.device_id, hello_methods, accepted, hosting, gone

    node_id, hello_methods, accepted, hosting, gone = asyncio.run(scenario())
    assert "node.runnerInventory.update" not in hello_methods  # a hidden method
    assert accepted == {"nodeId": node_id}
    assert (hosting["sessionHost"], hosting["workerSlots"]) == (True, {"total": 2, "available": 2})
    assert "issues" not in hosting
    assert not {"sessionHost", "workerSlots", "issues"} & set(gone)  # the declaration was the connection's


def test_a_host_that_would_not_keep_the_exec_policy_or_a_retired_supervisor_needs_an_update(gateway):
    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        worker = await _node(gateway, admin)
        await worker.request(
            "node.runnerInventory.update",
            {
                "protocolFeatures": ["node-worker-supervisor-v6"],
                "workerHost": {"enabled": True, "capacity": {"total": 1, "available": 1}},
            },
        )
        no_policy = row(await admin.request("node.list", {}), worker.device_id)
        with pytest.raises(GatewayError) as retired:
            await worker.request("node.runnerInventory.update", {"protocolFeatures": ["node-worker-supervisor-v5"]})
        retired_row = row(await admin.request("node.list", {}), worker.device_id)
        await worker.close()
        await admin.close()
        return worker.device_id, no_policy, retired.value, retired_row

    node_id, no_policy, retired, retired_row = asyncio.run(scenario())
    assert no_policy["issues"] == [UPDATE_REQUIRED] and no_policy["sessionHost"] is True
    assert retired.code == "INVALID_REQUEST"
    assert retired.message == (
        f"device worker node {node_id} requires an update before it can host sessions; run openclaw update, "
        "then reconnect it (for a headless node, run openclaw node restart)"
    )
    assert retired_row["issues"] == [UPDATE_REQUIRED] and retired_row["sessionHost"] is False


@pytest.mark.parametrize(
    "declaration",
    [
        {},
        {"protocolFeatures": "node-worker-supervisor-v6"},
        {"protocolFeatures": [], "workerHost": {"enabled": False}},
        {"protocolFeatures": ["node-worker-supervisor-v6"]},
        {"protocolFeatures": ["node-worker-supervisor-v7"], "workerHost": {"enabled": False}},
        {"protocolFeatures": ["node-worker-supervisor-v6", "x"], "workerHost": {"enabled": False}},
        {**HOST, "extra": 1},
        {**HOST, "workerHost": {**HOST["workerHost"], "gpu": 1}},
        {**HOST, "workerHost": {"enabled": False, "capacity": {"total": 1, "available": 1}}},
        {**HOST, "workerHost": {"enabled": True}},
        {**HOST, "workerHost": {"enabled": True, "capacity": {"total": 0, "available": 0}}},
        {**HOST, "workerHost": {"enabled": True, "capacity": {"total": 1025, "available": 1}}},
        {**HOST, "workerHost": {"enabled": True, "capacity": {"total": 2, "available": 3}}},
        {**HOST, "workerHost": {"enabled": True, "capacity": {"total": 2.0, "available": 1}}},
        {**HOST, "workerHost": {"enabled": True, "capacity": {"total": 2, "available": True}}},
        {**HOST, "workerHost": {"enabled": True, "capacity": {"total": 2, "available": 1, "spare": 1}}},
        {**HOST, "workerHost": {**HOST["workerHost"], "bundleStatus": 1}},
        {**HOST, "workerHost": {**HOST["workerHost"], "bundlePrewarm": 2}},
        {**HOST, "workerHost": {**HOST["workerHost"], "bundlePrewarm": True}},
        {**HOST, "workerHost": {**HOST["workerHost"], "capturedExecPolicy": 1}},
    ],
)
def test_an_inventory_outside_the_closed_shapes_is_refused_and_changes_nothing(gateway, declaration):
    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        worker = await _node(gateway, admin)
        await worker.request("node.runnerInventory.update", HOST)
        with pytest.raises(GatewayError) as refused:
            await worker.request("node.runnerInventory.update", declaration)
        after = row(await admin.request("node.list", {}), worker.device_id)
        await worker.close()
        await admin.close()
        return refused.value, after

    refused, after = asyncio.run(scenario())
    assert (refused.code, refused.message) == ("INVALID_REQUEST", "invalid node runner inventory")
    assert after["workerSlots"] == {"total": 2, "available": 2}  # the earlier declaration stands


def test_an_operator_cannot_declare_a_worker_host(gateway):
    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        with pytest.raises(GatewayError) as refused:
            await admin.request("node.runnerInventory.update", HOST)
        await admin.close()
        return refused.value

    refused = asyncio.run(scenario())
    assert refused.code == "INVALID_REQUEST"


def in_own_connection(fn, *args, **kwargs):
    """Database work from a scenario's thread, on a connection closed afterwards (the test database
    cannot be dropped while a connection stays open)."""
    try:
        return fn(*args, **kwargs)
    finally:
        connections.close_all()


def seed_active_placement_on(node_id: str) -> Session:
    """An active placement on a device environment of ``node_id`` (as a finished dispatch leaves it)."""
    session = session_create(spec=SessionSpec(key="agent:main:on-node", agent_id="main"))
    environment_id = "worker:on-node"
    WorkerEnvironment.objects.create(
        environment_id=environment_id,
        provider_id="device",
        profile_id=f"device:{node_id}",
        profile_snapshot=device_profile(node_id).snapshot(),
        state="attached",
        lease_id=f"device:{node_id}:op",
        node_device_id=node_id,
        owner_epoch=1,
        attached_session_ids=[session.session_id],
        created_at_ms=1,
        updated_at_ms=1,
        state_changed_at_ms=1,
    )
    placement = store.placement_start_dispatch(session=session)
    for from_state, to_state, patch in [
        ("requested", "provisioning", {"environment_id": environment_id}),
        ("provisioning", "syncing", {"worker_bundle_hash": "a" * 64}),
        ("syncing", "starting", {"workspace_base_manifest_ref": "sha256:" + "b" * 64, "remote_workspace_dir": "/w"}),
        ("starting", "active", {"active_owner_epoch": 1}),
    ]:
        placement = store.placement_transition(
            session=session,
            from_state=from_state,
            to_state=to_state,
            expected_generation=placement.generation,
            patch=patch,
        )
    return session


def test_removing_a_node_fails_its_placements_before_the_method_answers(gateway):
    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        worker = await _node(gateway, admin)
        await worker.request("node.runnerInventory.update", HOST)
        session = await asyncio.to_thread(in_own_connection, seed_active_placement_on, worker.device_id)
        removed = await admin.request("node.pair.remove", {"nodeId": worker.device_id})
        # Read as the method answered.
        placement = await asyncio.to_thread(in_own_connection, Placement.objects.get, pk=session.pk)
        await admin.close()
        return worker.device_id, removed, placement

    node_id, removed, failed = asyncio.run(scenario())
    assert removed == {"nodeId": node_id}
    assert failed.state == "failed"
    assert failed.terminal_reason.startswith("cloud worker disappeared: Worker provider no longer recognizes the lease")
    assert "not connected" in failed.recovery_error


def test_environments_list_shows_each_paired_node_as_a_persistent_host(gateway):
    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        worker = await _node(gateway, admin)
        await worker.request("node.runnerInventory.update", HOST)
        hosting = await admin.request("environments.list", {})
        await worker.close()
        await asyncio.sleep(0.3)
        away = await admin.request("environments.list", {})
        await admin.close()
        return worker.device_id, hosting, away

    node_id, hosting, away = asyncio.run(scenario())

    def node_env(listed: dict) -> dict:
        return next(row for row in listed["environments"] if row["id"] == f"node:{node_id}")

    row = node_env(hosting)
    assert (row["type"], row["status"], row["trust"], row["label"]) == ("node", "available", "persistent", "test-node")
    assert (row["sessionHost"], row["workerSlots"]) == (True, {"total": 2, "available": 2})
    assert row["invocableCommands"] == ["echo"]  # never the private worker commands
    gone = node_env(away)
    assert (gone["status"], gone["sessionHost"]) == ("unavailable", False)
    assert "workerSlots" not in gone and "lastDisconnectedAtMs" in gone
