"""A ``static-ssh`` profile with real processes: a dispatch logs in over SSH (a real ``sshd`` on loopback) as a
separate unprivileged account that cannot read this checkout, installs the node host there from the bundle
the gateway serves (with the host's own ``python3`` and packages from the index), enrolls it with a
pre-approved pairing, and the session's turn runs in a worker child of that node host; the move back
brings the worker's workspace change into the worktree."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

from sessions_app.models import Session
from tests.e2e.test_seed_004_paired_node_worker_lifecycle import Wire, model_env, publish_workspace
from tests.support.clients import operator
from tests.support.processes import ROOT, free_port
from tests.support.sshd import start_sshd, unprivileged_user

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(os.geteuid() != 0, reason="the worker host's own account is created with useradd (root)"),
]

WORKER_USER = "openclaw-ssh-worker"
INSTALL_WAIT_S = 300


def run_as(user: str, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", user, "--", *command], capture_output=True, text=True, timeout=60)


@pytest.fixture
def worker_host():
    """The SSH server and the account it logs in as, with a fresh worker install (the venv of the host's
    packages is kept between runs: it holds nothing of the gateway's)."""
    user = unprivileged_user(WORKER_USER)
    home = Path(pwd.getpwnam(user).pw_dir)
    subprocess.run(["pkill", "-u", user, "-f", "openclaw_client.node"], capture_output=True)
    for part in ("state", "runtime", "node-host.pid", "node-host.log"):
        path = home / ".openclaw-worker" / part
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    server = start_sshd(login_user=user)
    try:
        yield server, home
    finally:
        subprocess.run(["pkill", "-u", user, "-f", "openclaw_client.node"], capture_output=True)
        server.remove()


@pytest.fixture
def checkout_closed_to_others():
    """Nobody but root may read the checkout while the test runs (root's own processes are unaffected)."""
    mode = ROOT.stat().st_mode & 0o777
    ROOT.chmod(mode & 0o770)
    try:
        yield
    finally:
        ROOT.chmod(mode)


def test_a_static_ssh_profile_installs_the_node_host_from_the_served_bundle_and_runs_a_turn(
    gateway_factory, mock_openai, tmp_path, worker_host, checkout_closed_to_others
):
    server, home = worker_host
    workspace_root = tmp_path / "allowed"
    workspace_root.mkdir()
    published = publish_workspace(workspace_root)
    port = free_port()
    profiles = {
        "ssh-dev": {"provider": "static-ssh", "settings": server.profile_settings(workDir="~/.openclaw-worker")}
    }
    env = {
        **model_env(mock_openai, workspace_root),
        "OPENCLAW_WORKER_PROFILES": json.dumps(profiles),
        "OPENCLAW_WORKER_GATEWAY_URL": f"ws://127.0.0.1:{port}",
        "OPENCLAW_WORKER_DISPATCH_WAIT_MS": str(INSTALL_WAIT_S * 1000),
    }
    gateway = gateway_factory(extra_env=env, port=port)
    # The account cannot read the checkout: whatever runs there came from the gateway.
    assert run_as(WORKER_USER, "ls", str(ROOT)).returncode != 0

    async def scenario():
        client = operator(gateway)
        await client.connect()
        wire = Wire(client, published)
        try:
            key = await wire.create_session("ssh-profile")
            dispatched = await client.request(
                "sessions.dispatch", {"key": key, "profileId": "ssh-dev"}, timeout=INSTALL_WAIT_S + 20
            )
            placement = dispatched["placement"]
            assert placement["state"] == "active", placement
            assert placement["providerId"] == "static-ssh"
            nodes = (await client.request("node.list", {}))["nodes"]
            host_nodes = [n for n in nodes if n.get("displayName") == f"{WORKER_USER}@127.0.0.1"]
            assert len(host_nodes) == 1 and host_nodes[0]["connected"] is True, nodes
            await wire.expect_successful_turn(key, "SSH-PROFILE-TURN")

            remote = Path(placement["remoteWorkspaceDir"])
            assert remote.is_relative_to(home / ".openclaw-worker" / "state")
            (remote / "src" / "app.py").write_text("print('changed on the ssh worker')\n")
            moved = await wire.move_to_gateway(key)
            assert moved["state"] == "local"
            await wire.expect_successful_turn(key, "SSH-AFTER-MOVE")
            return key
        finally:
            await client.close()

    key = asyncio.run(scenario())
    worker = home / ".openclaw-worker"
    pid = int((worker / "node-host.pid").read_text())
    status = Path(f"/proc/{pid}/status").read_text()
    uid = pwd.getpwnam(WORKER_USER).pw_uid
    assert f"Uid:\t{uid}\t" in status  # the node host runs as the unprivileged account
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[0].decode().startswith(str(worker / "venv" / "bin"))
    environ = dict(
        item.split(b"=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in item
    )
    runtime = Path(environ[b"PYTHONPATH"].decode())
    assert runtime.parent == worker / "runtime" and (runtime / "openclaw_client" / "node.py").is_file()
    worktree = Path(Session.objects.get(key=key).worktree["path"])
    assert (worktree / "src" / "app.py").read_text() == "print('changed on the ssh worker')\n"
