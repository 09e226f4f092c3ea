"""The ``local`` worker provider with real processes: a dispatch to a ``local`` profile starts a node host on
this machine (pre-approved pairing, no operator step), the session's worktree is synced to it, a turn runs
in a worker child there, the worker's change to the workspace comes back with the move to the gateway,
and the move stops the node host and withdraws its pairing."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from sessions_app.models import Session
from tests.e2e.test_seed_004_paired_node_worker_lifecycle import Wire, model_env, publish_workspace
from tests.support.clients import operator
from tests.support.processes import free_port
from workers_app.models import Placement, WorkerEnvironment
from workers_app.services.recovery import workers_recovery_sweep

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PROFILES = {"local-dev": {"provider": "local", "settings": {"capacity": 2, "capacityWaitMs": 500}}}


@pytest.fixture
def local_gateway(gateway_factory, mock_openai, tmp_path):
    """A gateway with a ``local-dev`` profile, and the published checkout its sessions' worktrees come from."""
    workspace_root = tmp_path / "allowed"
    workspace_root.mkdir()
    published = publish_workspace(workspace_root)
    port = free_port()
    env = {
        **model_env(mock_openai, workspace_root),
        "OPENCLAW_WORKER_PROFILES": json.dumps(PROFILES),
        # A Celery worker starts the node host: it is told where the gateway listens.
        "OPENCLAW_WORKER_GATEWAY_URL": f"ws://127.0.0.1:{port}",
    }
    return gateway_factory(extra_env=env, port=port), published


def pid_alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes() != b""
    except OSError:
        return False


def test_a_local_profile_runs_a_turn_on_a_started_node_host_and_moves_back(local_gateway):
    gateway, published = local_gateway

    async def scenario():
        client = operator(gateway)
        await client.connect()
        wire = Wire(client, published)
        try:
            key = await wire.create_session("local-profile")
            dispatched = await client.request("sessions.dispatch", {"key": key, "profileId": "local-dev"}, timeout=120)
            placement = dispatched["placement"]
            assert placement["state"] == "active", placement
            assert placement["providerId"] == "local" and placement["profileId"] == "local-dev"
            nodes = (await client.request("node.list", {}))["nodes"]
            local_nodes = [n for n in nodes if n.get("displayName", "").startswith("local-worker-")]
            assert len(local_nodes) == 1 and local_nodes[0]["connected"] is True
            assert local_nodes[0]["workerBundle"]["status"] == "installed"
            await wire.expect_successful_turn(key, "LOCAL-PROFILE-TURN")

            # The worker changes its workspace; the move back brings the change into the worktree. Its workspace is
            # on this host: the placement names it relative to the gateway's state directory.
            assert placement["remoteWorkspaceDir"].startswith("local-workers/"), placement["remoteWorkspaceDir"]
            remote = Path(gateway.state_dir) / placement["remoteWorkspaceDir"]
            assert (remote / "src" / "app.py").read_text() == "print('hello from the worker')\n"
            (remote / "src" / "app.py").write_text("print('changed on the worker')\n")
            (remote / "NOTES.md").write_text("written on the worker\n")
            (remote / "README.md").unlink()
            source = await wire.describe_placement(key)
            moved = await wire.move_to_gateway(key)
            assert moved["state"] == "local"
            environments = await wire.read_environments()
            environment = next(e for e in environments if e["id"] == source["environmentId"])
            await wire.expect_successful_turn(key, "LOCAL-AFTER-MOVE")
            nodes_after = (await client.request("node.list", {}))["nodes"]
            return key, local_nodes[0], environment, nodes_after
        finally:
            await client.close()

    key, local_node, environment, nodes_after = asyncio.run(scenario())
    assert environment["worker"]["state"] == "destroyed", environment
    # The node host was stopped and its pairing withdrawn.
    assert local_node["nodeId"] not in {n["nodeId"] for n in nodes_after}
    state_dirs = list((Path(gateway.state_dir) / "local-workers").glob("*"))
    assert state_dirs == []
    path = Path(Session.objects.get(key=key).worktree["path"])
    assert (path / "src" / "app.py").read_text() == "print('changed on the worker')\n"
    assert (path / "NOTES.md").read_text() == "written on the worker\n"
    assert not (path / "README.md").exists()


def test_a_local_node_host_that_dies_is_found_gone_by_its_provider(local_gateway, settings):
    """Its process killed, the lease inspects ``unknown`` (authoritative absence): recovery fails the
    placement with the disappearance reason instead of waiting on a node that will not come back."""
    gateway, published = local_gateway

    async def dispatch():
        client = operator(gateway)
        await client.connect()
        try:
            wire = Wire(client, published)
            key = await wire.create_session("local-dies")
            await client.request("sessions.dispatch", {"key": key, "profileId": "local-dev"}, timeout=120)
            return key
        finally:
            await client.close()

    asyncio.run(dispatch())
    (state_dir,) = (Path(gateway.state_dir) / "local-workers").glob("*")
    pid = int((state_dir / "node-host.pid").read_text())
    os.kill(pid, 9)
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(pid)

    settings.STATE_DIR = Path(gateway.state_dir)  # the provider finds its node hosts under the gateway's state
    workers_recovery_sweep()
    environment = WorkerEnvironment.objects.get(provider_id="local")
    assert environment.state in ("failed", "orphaned", "destroyed"), environment.state
    placement = Placement.objects.get(environment_id=environment.pk)
    assert placement.state == "failed"
    assert placement.terminal_reason.startswith("cloud worker disappeared:"), placement.terminal_reason
