"""OpenClaw's own node host (2026.9.6, unmodified, from the workplace's ``openclaw-cli`` tool) syncs a session's
worktree from this gateway and reconciles its changes back: ``worker.workspace.exec.v1`` transfers over the
``/__openclaw__/worker-transfer/v1`` routes of a real gateway process.

The drivers run in this test process, as they run in a Celery worker: the call reaches the node through the
gateway's channel layer, and the routes read the operation from the cache they share — so this needs the
Redis profile (under the embedded one the test process and the gateway share neither).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from sessions_app.models import Session
from tests.e2e.test_openclaw_compat import start_openclaw_node, wait_until
from tests.e2e.test_openclaw_node_worker import approve_node
from tests.e2e.test_seed_004_paired_node_worker_lifecycle import Wire, model_env, publish_workspace
from tests.support.clients import operator
from tests.support.openclaw_cli import require_openclaw_cli
from tests.workers_app.test_openclaw_transfers import ENVIRONMENT, activate, syncing_session, write
from workers_app.models import Placement, WorkerEnvironment
from workers_app.nodes.openclaw import workspace
from workers_app.nodes.openclaw.dialect import gateway_namespace, node_speaks_openclaw

pytestmark = [pytest.mark.e2e, pytest.mark.openclaw_cli, pytest.mark.django_db(transaction=True)]


def test_openclaws_node_host_syncs_a_worktree_and_reconciles_its_changes_back(gateway_factory, node_home, tmp_path):
    require_openclaw_cli()
    if "redis" not in settings.CHANNEL_LAYERS["default"]["BACKEND"].lower():
        pytest.skip("needs the Redis profile: the test process calls the node through the gateway's channel layer")
    gateway = gateway_factory(extra_env={"OPENCLAW_REDIS_PREFIX": settings.REDIS_PREFIX})
    with openclaw_node_of(gateway, node_home) as node_id:
        worktree = tmp_path / "worktree"
        write(worktree, "README.md", b"# project\n")
        write(worktree, "src/app.py", b"print('hello')\n")
        write(worktree, "bin/run", b"#!/bin/sh\necho run\n", 0o755)
        write(worktree, "caf\u00e9/\U0001f600 notes.txt", "unicode \u00e9".encode())
        write(worktree, "node_modules/dep/index.js", b"derived: stays here")
        session = syncing_session(worktree, node_id)
        environment = WorkerEnvironment.objects.get(pk=ENVIRONMENT)

        synced = workspace.sync_workspace(node_id, worktree, session, environment)

        remote = Path(synced.remote_workspace_dir)
        assert remote.parts[-6:-3] == ("node-host", gateway_namespace(), "workspaces") and remote.name == "1"
        assert remote.is_relative_to(node_home / ".openclaw" / "node-host")
        assert sorted(str(p.relative_to(remote)) for p in remote.rglob("*") if p.is_file()) == [
            "README.md",
            "bin/run",
            "caf\u00e9/\U0001f600 notes.txt",
            "src/app.py",
        ]
        assert (remote / "bin/run").stat().st_mode & 0o111

        activate(session, synced)
        write(remote, "src/app.py", b"print('changed on the node')\n")
        write(remote, "new/tool.sh", b"#!/bin/sh\n", 0o755)
        (remote / "README.md").unlink()
        placement = Placement.objects.get(pk=session.pk)

        changed = workspace.reconcile_workspace(
            node_id, worktree, session, placement, WorkerEnvironment.objects.get(pk=ENVIRONMENT)
        )

        assert changed == 3
        assert (worktree / "src/app.py").read_bytes() == b"print('changed on the node')\n"
        assert (worktree / "new/tool.sh").stat().st_mode & 0o777 == 0o755
        assert not (worktree / "README.md").exists()
        assert (worktree / "node_modules/dep/index.js").exists()
    node_log = (node_home / "node-host.log").read_text()
    assert "workspace-transfer-failed" not in node_log, node_log


def test_a_worktree_session_goes_to_openclaws_node_host_and_comes_back_with_its_changes(
    gateway_factory, mock_openai, node_home, tmp_path
):
    """Over the wire, as an operator does it: a worktree session dispatched onto OpenClaw's node host (bundle
    installed, worktree synced, active), changes made in the node's copy, ``sessions.move`` back to the gateway
    (reconciled, the environment torn down) — the changes are in the session's worktree."""
    require_openclaw_cli()
    workspace_root = tmp_path / "allowed"
    workspace_root.mkdir()
    published = publish_workspace(workspace_root)
    gateway = gateway_factory(extra_env=model_env(mock_openai, workspace_root))
    with openclaw_node_of(gateway, node_home) as node_id:

        async def dispatch(wire: Wire) -> tuple[str, dict]:
            key = await wire.create_session("on-openclaw-node")
            return key, await wire.dispatch_node_session(key, node_id)

        key, _placement = run_over_the_wire(gateway, published, dispatch)
        remote = Path(Placement.objects.get(session__key=key).remote_workspace_dir)
        assert sorted(str(p.relative_to(remote)) for p in remote.rglob("*") if p.is_file()) == [
            "README.md",
            "run.sh",
            "src/app.py",
        ]
        assert (remote / "run.sh").stat().st_mode & 0o111
        write(remote, "src/app.py", b"print('edited on the openclaw node')\n")
        write(remote, "notes/from-node.md", b"written on the node\n")
        (remote / "README.md").unlink()

        moved = run_over_the_wire(gateway, published, lambda wire: wire.move_to_gateway(key))
    assert moved["state"] == "local", (moved, (node_home / "node-host.log").read_text())
    worktree = Path(Session.objects.get(key=key).worktree["path"])
    assert (worktree / "src/app.py").read_text() == "print('edited on the openclaw node')\n"
    assert (worktree / "notes/from-node.md").read_text() == "written on the node\n"
    assert not (worktree / "README.md").exists()
    assert (worktree / "run.sh").exists()


def run_over_the_wire(gateway, published: Path, steps):
    """``steps(wire)`` over one operator connection to ``gateway``."""

    async def run():
        client = operator(gateway)
        await client.connect()
        try:
            return await steps(Wire(client, published))
        finally:
            await client.close()

    return asyncio.run(run())


@contextlib.contextmanager
def openclaw_node_of(gateway, home: Path) -> Iterator[str]:
    """OpenClaw's node host on ``gateway`` from ``home`` (its log in ``home/node-host.log``), paired and declared a
    worker host in OpenClaw's dialect; its node id. Stopped at the end."""
    with (home / "node-host.log").open("w") as log:
        node = start_openclaw_node(gateway, str(home), stderr=log)
    try:
        node_id = approve_node()
        wait_until(lambda: node_speaks_openclaw(node_id), 90)
        yield node_id
    finally:
        node.terminate()
        node.wait(20)
