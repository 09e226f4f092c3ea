"""OpenClaw's own node host, unmodified, as this gateway's worker host (issue 29; node-worker-dialect.md): it pairs,
declares itself a worker host in OpenClaw's dialect, is told by the retain snapshot that it lacks this gateway's
bundle, and installs it when a session is dispatched onto it — the bundle downloaded over the install's single-use
token, checked, unpacked and prewarmed by OpenClaw's own installer.

Grows with the dialect: the dispatch goes on through the workspace transfer (OpenClaw's node pulls the session's
workspace over the transfer routes) to active; the turn, the move back and the teardown follow it here.

Needs the workplace's ``openclaw-cli`` tool (Node 24 and the npm ``openclaw`` package); without it the test is left
out by marker or skips, and under ``CI=true`` fails instead.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path

import pytest

from devices_app.models import DevicePairingRequest
from devices_app.services import pairing
from gateway.audit import Actor
from gateway.models import GatewayConnection
from sessions_app.models import Session
from tests.e2e.test_openclaw_compat import start_openclaw_node, wait_until
from tests.support.clients import operator
from tests.support.openclaw_cli import require_openclaw_cli
from workers_app.models import NodeWorkerHost, Placement, WorkerEnvironment
from workers_app.nodes.device_provider import device_lease_id, device_profile
from workers_app.nodes.openclaw import manifest as oc_manifest
from workers_app.nodes.openclaw.bundle import bundle_files, openclaw_bundle
from workers_app.nodes.openclaw.dialect import node_speaks_openclaw

pytestmark = [pytest.mark.e2e, pytest.mark.openclaw_cli, pytest.mark.django_db(transaction=True)]


def approve_node() -> str:
    wait_until(lambda: DevicePairingRequest.objects.filter(role="node", status="pending").exists(), 90)
    request = DevicePairingRequest.objects.get(role="node", status="pending")
    pairing.pairing_request_approve(request_id=str(request.pk), actor=Actor.system("test"))
    wait_until(lambda: GatewayConnection.objects.filter(role="node", node_id=request.device_id).exists(), 90)
    return request.device_id


async def node_row(admin, node_id: str, *, bundle: str) -> dict:
    """The node's ``node.list`` row once it shows the bundle ``bundle`` (or after a few seconds, as it is then):
    a row may lag a change another process made by the catalog's version check."""
    for _attempt in range(50):
        row = next(n for n in (await admin.request("node.list", {}))["nodes"] if n["nodeId"] == node_id)
        if row.get("workerBundle", {}).get("status") == bundle:
            break
        await asyncio.sleep(0.1)
    return row


def gateway_folder(node_home: Path) -> Path:
    """This gateway's one folder in the node's state (``node-host/<gatewayNamespace>``)."""
    [folder] = [path for path in (node_home / ".openclaw" / "node-host").iterdir() if path.name.startswith("gateway-")]
    assert re.fullmatch(r"gateway-[0-9a-f]{32}", folder.name)
    return folder


def bundle_status(node_id: str) -> str:
    host = NodeWorkerHost.objects.filter(node_id=node_id).first()
    return host.bundle_status if host is not None else ""


def test_openclaw_s_node_host_installs_this_gateway_s_bundle_when_a_session_is_dispatched_onto_it(gateway, node_home):
    require_openclaw_cli()
    built = openclaw_bundle()
    log_path = node_home / "node-host.log"
    with log_path.open("w") as log:
        node = start_openclaw_node(gateway, str(node_home), stderr=log)
    try:
        node_id = approve_node()
        # Its declaration (after hello-ok's capabilities), then the retain snapshot's answer: no bundle yet.
        wait_until(lambda: bundle_status(node_id) == "missing", 90)
        host = NodeWorkerHost.objects.get(node_id=node_id)
        assert host.protocol_features == ["node-worker-supervisor-v6"]
        assert {key: host.worker_host.get(key) for key in ("environmentSession", "capturedExecPolicy")} == {
            "environmentSession": 1,
            "capturedExecPolicy": True,
        }
        assert node_speaks_openclaw(node_id)
        assert host.bundle_hash == built.bundle_hash

        async def dispatch():
            admin = operator(gateway)
            await admin.connect()
            before = await node_row(admin, node_id, bundle="missing")
            await admin.request("sessions.create", {"key": "on-openclaw-node"})
            dispatched = await admin.request_frame(
                "sessions.dispatch", {"key": "on-openclaw-node", "deviceId": node_id}
            )
            after = await node_row(admin, node_id, bundle="installed")
            await admin.close()
            return before, dispatched, after

        before, dispatched, after = asyncio.run(dispatch())
    finally:
        node.terminate()
        node.wait(20)
    node_log = log_path.read_text()

    row = before
    assert row["sessionHost"] is True and row["workerBundle"] == {"status": "missing"}
    assert not any(command.startswith("worker.") for command in row.get("commands", []))

    # The install: the bundle and its receipt under the node's state folder, in this gateway's namespace.
    installed = gateway_folder(node_home) / "bundles" / built.bundle_hash
    assert sorted(path.name for path in installed.iterdir()) == sorted(
        ["bootstrap-receipt.json", *(file.path for file in bundle_files())]
    ), node_log
    for file in bundle_files():
        assert (installed / file.path).read_bytes() == file.data
    receipt = json.loads((installed / "bootstrap-receipt.json").read_text())
    assert {key: receipt[key] for key in ("bundleHash", "openclawVersion", "protocolFeatures")} == built.build()

    row = after
    assert row["workerBundle"] == {"status": "installed", "version": built.openclaw_version}

    # The environment was bootstrapped with OpenClaw's build identity; the dispatch went on to active.
    environment = WorkerEnvironment.objects.get(provider_id="device", profile_id=f"device:{node_id}")
    assert (
        environment.bootstrap_bundle_hash,
        environment.bootstrap_openclaw_version,
        environment.bootstrap_protocol_features,
        environment.bootstrap_install_kind,
    ) == (built.bundle_hash, built.openclaw_version, list(built.protocol_features), "bundle")
    placement = Placement.objects.get(session__key="agent:main:on-openclaw-node")
    assert dispatched["ok"] is True, dispatched
    assert placement.state == "active"
    # The session has no worktree: OpenClaw's node pulled the empty manifest into the workspace of the epoch the
    # session holds there.
    assert placement.workspace_base_manifest_ref == oc_manifest.manifest_ref(oc_manifest.serialize([]))
    remote = Path(placement.remote_workspace_dir)
    assert remote.parent.parent.parent == gateway_folder(node_home) / "workspaces"
    assert remote.name == str(placement.active_owner_epoch) and list(remote.iterdir()) == []


def wait_for_connection(node_id: str, *, other_than: str | None, bundle: str) -> str:
    """The node's connection (not ``other_than``) once its retain answer said ``bundle``; returns its id."""

    def reached() -> bool:
        host = NodeWorkerHost.objects.filter(node_id=node_id).first()
        return host is not None and host.conn_id != other_than and host.bundle_status == bundle

    wait_until(reached, 90)
    return NodeWorkerHost.objects.get(node_id=node_id).conn_id


def attached_environment_on(node_id: str) -> WorkerEnvironment:
    """An environment of this gateway attached to a session on the node, as a dispatch leaves it."""
    session = Session.objects.create(key="agent:main:stopped-on-openclaw-node", agent_id="main")
    profile = device_profile(node_id)
    return WorkerEnvironment.objects.create(
        environment_id="worker:openclaw-node-stop",
        provider_id="device",
        profile_id=profile.id,
        profile_snapshot=profile.snapshot(),
        state="attached",
        lease_id=device_lease_id(node_id, "stop-test"),
        node_device_id=node_id,
        shared_host=True,
        owner_epoch=1,
        attached_session_ids=[session.session_id],
        created_at_ms=1,
        updated_at_ms=1,
        state_changed_at_ms=1,
    )


def test_openclaw_s_node_host_stops_environments_and_reinstalls_a_bundle_it_lost(gateway, node_home):
    require_openclaw_cli()
    built = openclaw_bundle()
    log_path = node_home / "node-host.log"
    log = log_path.open("w")
    node = start_openclaw_node(gateway, str(node_home), stderr=log)

    async def dispatch(key: str) -> dict:
        admin = operator(gateway)
        await admin.connect()
        await admin.request("sessions.create", {"key": key})
        dispatched = await admin.request_frame("sessions.dispatch", {"key": key, "deviceId": node_id})
        await admin.close()
        return dispatched

    async def destroy(environment_id: str) -> dict:
        admin = operator(gateway)
        await admin.connect()
        destroyed = await admin.request_frame("environments.destroy", {"environmentId": environment_id, "force": True})
        await admin.close()
        return destroyed

    try:
        node_id = approve_node()
        first = wait_for_connection(node_id, other_than=None, bundle="missing")
        assert asyncio.run(dispatch("first-on-openclaw-node"))["ok"] is True
        bundle_dir = gateway_folder(node_home) / "bundles" / built.bundle_hash
        assert (bundle_dir / "worker.mjs").is_file()

        # worker.environment.stop.v1 in OpenClaw's shape answers null; the retain after it keeps the bundle.
        environment = attached_environment_on(node_id)
        destroyed = asyncio.run(destroy(environment.pk))
        assert destroyed["ok"] is True, destroyed
        environment.refresh_from_db()
        assert (environment.state, environment.last_error) == ("destroyed", None)
        assert (bundle_dir / "worker.mjs").is_file()

        # A reconnect's retain finds the bundle kept...
        node.terminate()
        node.wait(20)
        node = start_openclaw_node(gateway, str(node_home), stderr=log)
        second = wait_for_connection(node_id, other_than=first, bundle="installed")

        # ...and, once it is gone from the node, reports it missing; the next dispatch installs it again.
        node.terminate()
        node.wait(20)
        shutil.rmtree(bundle_dir)
        node = start_openclaw_node(gateway, str(node_home), stderr=log)
        wait_for_connection(node_id, other_than=second, bundle="missing")
        assert asyncio.run(dispatch("second-on-openclaw-node"))["ok"] is True
        assert bundle_status(node_id) == "installed"
    finally:
        node.terminate()
        node.wait(20)
        log.close()
    assert sorted(path.name for path in bundle_dir.iterdir()) == sorted(
        ["bootstrap-receipt.json", *(file.path for file in bundle_files())]
    ), log_path.read_text()
