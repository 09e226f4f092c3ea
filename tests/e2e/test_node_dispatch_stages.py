"""A dispatch to a node killed at each stage of the real runtime: the gateway running it is killed (SIGKILL,
in-process tasks die with it) while the node holds the stage's command — the workspace sync (``syncing``)
or the start check (``starting``) — and the next gateway's startup recovery fails the placement cleanly
with ``Worker dispatch interrupted in <stage>``; the session then works locally again.

The node is a real WebSocket peer driven by the test (its commands answer as a node host's do, except the
one it holds), so the test decides exactly where the dispatch stands when the gateway dies."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

import pytest

from openclaw_client.client import GatewayError, NodeCommandError
from openclaw_client.node import NODE_HOST_CAPS, NODE_HOST_COMMANDS
from tests.support.clients import call_once, operator, paired_node
from tests.support.processes import GatewayLaunch, free_port, gateway_settings_for_tests

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

HOST = {
    "protocolFeatures": ["node-worker-supervisor-v6"],
    "workerHost": {"enabled": True, "capacity": {"total": 2, "available": 2}, "capturedExecPolicy": True},
}


def node_commands(hold: str):
    """A node host's answers up to the held stage; ``hold`` is never answered (the start check,
    ``worker.status.v1``, is held or never reached)."""

    async def handle(command: str, params):
        if command == hold:
            await asyncio.Event().wait()
        if command == "worker.workspace.retain.v1":
            return {"applied": True, "deleted": {"environments": [], "bundles": []}, "hasMore": False,
                    "bundleStatus": "installed"}  # fmt: skip
        if command == "worker.bundle.install.v1":
            return {
                "bundleHash": params["bundleHash"],
                "openclawVersion": params["openclawVersion"],
                "protocolFeatures": ["node-worker-supervisor-v6"],
                "installKind": "existing",
            }
        if command == "worker.workspace.prepare.v1":
            return {"status": "ready", "manifestRef": params["manifestRef"], "remoteWorkspaceDir": "/node/ws"}
        if command == "worker.environment.stop.v1":
            return {"stopped": True, "environmentIds": []}
        raise AssertionError(f"unexpected command {command}")

    return handle


@pytest.mark.parametrize(
    ("stage", "held"), [("syncing", "worker.workspace.prepare.v1"), ("starting", "worker.status.v1")]
)
def test_a_dispatch_killed_in_a_stage_fails_as_interrupted_at_the_next_start(stage, held):
    port = free_port()
    settings = {
        **gateway_settings_for_tests(port),
        # The dispatch runs in the gateway process, and dies with it.
        "OPENCLAW_TASK_MODE": "inprocess",
        "OPENCLAW_WORKER_DISPATCH_WAIT_MS": "200",
    }
    launch = GatewayLaunch.prepare(port=port, settings=settings)
    gateway = launch.start(worker=False)
    restarted = None
    try:
        call_once(gateway, "sessions.create", {"key": "staged"})

        async def dispatch_until_held() -> str:
            admin = operator(gateway)
            await admin.connect()
            node = await paired_node(
                gateway, admin, commands=list(NODE_HOST_COMMANDS), caps=list(NODE_HOST_CAPS),
                invoke_handler=node_commands(held),
            )  # fmt: skip
            await node.request("node.runnerInventory.update", HOST)
            await admin.request("sessions.dispatch", {"key": "staged", "deviceId": node.device_id})
            deadline = time.monotonic() + 30
            while True:
                described = await admin.request("sessions.describe", {"key": "staged"})
                if described["session"]["placement"]["state"] == stage:
                    return node.device_id
                assert time.monotonic() < deadline, described
                await asyncio.sleep(0.05)

        asyncio.run(dispatch_until_held())
        gateway.stop(signal.SIGKILL)
        restarted = launch.start(worker=False)
        deadline = time.monotonic() + 30
        while True:
            placement = call_once(restarted, "sessions.describe", {"key": "agent:main:staged"})["session"]["placement"]
            if placement["state"] == "failed" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert placement["state"] == "failed", placement
        # The cause first; then why the node could not confirm its cleanup (it went down with the gateway).
        assert placement["terminalReason"].startswith(f"Worker dispatch interrupted in {stage}; environment destroy: ")
        assert placement["recoveryError"] == placement["terminalReason"]
        assert "device worker node is not connected" in placement["recoveryError"]
        # The session is the gateway's again once an operator continues it here.
        recovered = call_once(
            restarted,
            "sessions.reclaim",
            {"key": "agent:main:staged", "recoverToGateway": {"expectedGeneration": placement["generation"]}},
        )
        assert recovered["placement"]["state"] == "local", recovered
    finally:
        for server in (restarted, gateway):
            if server is not None:
                server.stop()
        launch.remove_state()


def wrong_receipt_node(answer: str):
    """A node whose install answers a receipt of another build (``wrong-hash``: another bundle's hash;
    ``corrupted``: it refuses the download, as a node host does when the sha256 does not match)."""

    async def handle(command: str, params):
        if command == "worker.workspace.retain.v1":
            return {"applied": True, "deleted": {"environments": [], "bundles": []}, "hasMore": False}
        if command == "worker.bundle.install.v1":
            if answer == "corrupted":
                raise NodeCommandError(
                    "BUNDLE_INSTALL_FAILED",
                    "worker bundle installation failed: the download does not match the bundle's sha256",
                )
            return {
                "bundleHash": "0" * 64,
                "openclawVersion": params["openclawVersion"],
                "protocolFeatures": ["node-worker-supervisor-v6"],
                "installKind": "installed",
            }
        if command == "worker.environment.stop.v1":
            return {"stopped": True, "environmentIds": []}
        raise AssertionError(f"unexpected command {command}")  # nothing past the install may reach the node

    return handle


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("wrong-hash", "Device worker bundle installer returned a mismatched build receipt"),
        (
            "corrupted",
            "Device worker bundle installation failed: worker bundle installation failed: "
            "the download does not match the bundle's sha256",
        ),
    ],
)
def test_a_receipt_of_another_bundle_or_a_corrupted_download_fails_the_dispatch_in_provisioning(
    gateway, answer, reason
):
    """Issue 26 point 7, the gateway's side: the install receipt must name the bundle the gateway sent, and a
    node's refusal of a corrupted bundle fails the dispatch with its reason; the node is not recorded as
    having the bundle and no workspace is sent to it."""

    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        try:
            node = await paired_node(
                gateway, admin, commands=list(NODE_HOST_COMMANDS), caps=list(NODE_HOST_CAPS),
                invoke_handler=wrong_receipt_node(answer),
            )  # fmt: skip
            await node.request("node.runnerInventory.update", HOST)
            await admin.request("sessions.create", {"key": "receipt"})
            with contextlib.suppress(GatewayError):  # the dispatch may answer its failure or still be under way
                await admin.request("sessions.dispatch", {"key": "receipt", "deviceId": node.device_id}, timeout=60)
            deadline = time.monotonic() + 30
            while True:
                placement = (await admin.request("sessions.describe", {"key": "receipt"}))["session"]["placement"]
                if placement["state"] == "failed" or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            listed = await admin.request("node.list", {})
            await node.close()
            return placement, next(row for row in listed["nodes"] if row["nodeId"] == node.device_id)
        finally:
            await admin.close()

    placement, row = asyncio.run(scenario())
    assert placement["state"] == "failed", placement
    assert placement["terminalReason"].startswith(f"Worker dispatch failed in provisioning: {reason}"), placement
    assert (row.get("workerBundle") or {}).get("status") != "installed", row
