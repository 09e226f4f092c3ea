"""The node host program (``python -m openclaw_client.node``) in its own process against a real gateway:
it asks for pairing and waits for the operator, declares its worker host after every connect, comes
back by itself when the gateway restarts, and a node removal disconnects it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from openclaw_client.identity import IdentityStore
from tests.support.clients import call_once
from tests.support.processes import (
    ROOT,
    GatewayLaunch,
    GatewayServer,
    free_port,
    gateway_settings_for_tests,
    start_node_host,
)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def node_row(server: GatewayServer, *, until, timeout: float = 30.0) -> dict:
    """The node host's row in node.list once ``until(row)`` holds."""
    deadline = time.monotonic() + timeout
    latest: dict = {}
    while time.monotonic() < deadline:
        rows = [n for n in call_once(server, "node.list", {})["nodes"] if n.get("displayName") == "test-node-host"]
        latest = rows[0] if rows else {}
        if latest and until(latest):
            return latest
        time.sleep(0.2)
    raise AssertionError(f"node row never matched: {latest}")


def hosting(row: dict) -> bool:
    return row.get("connected") is True and row.get("workerSlots") == {"total": 2, "available": 2}


def test_the_node_host_pairs_declares_its_slots_reconnects_and_is_removed():
    port = free_port()
    launch = GatewayLaunch.prepare(port=port, settings=gateway_settings_for_tests(port))
    gateway = launch.start()
    node_host = start_node_host(gateway, capacity=2)
    try:
        call_once(gateway, "node.pair.approve", {"requestId": node_host.pairing_request()})
        first = node_row(gateway, until=hosting)
        assert first["sessionHost"] is True and "issues" not in first

        gateway.stop()
        gateway = launch.start()
        again = node_row(gateway, until=hosting)  # it reconnected and declared again, by itself
        assert again["nodeId"] == first["nodeId"]

        call_once(gateway, "node.pair.remove", {"nodeId": first["nodeId"]})
        removed = node_row(gateway, until=lambda row: not row.get("connected"))
        assert "workerSlots" not in removed
    finally:
        exit_code = node_host.stop()
        node_host_log = node_host.log()
        gateway.stop()
        launch.remove_state()
        node_host.remove_state()
    assert exit_code == 0, node_host_log  # SIGTERM is a clean stop


def node_disk(node_host) -> dict[str, list[str]]:
    state = Path(node_host.state_dir)
    return {
        folder: sorted(entry.name for entry in (state / folder).iterdir()) if (state / folder).is_dir() else []
        for folder in ("workspaces", "environments", "bundles", "blobs")
    }


def place_a_session_on(gateway: GatewayServer, node_host, node_id: str) -> dict[str, list[str]]:
    """A session dispatched onto the node and active there; returns what the node keeps for it on its disk."""
    call_once(gateway, "sessions.create", {"key": "on-the-node"})
    call_once(gateway, "sessions.dispatch", {"key": "on-the-node", "deviceId": node_id})
    deadline = time.monotonic() + 60
    while (placed := call_once(gateway, "sessions.describe", {"key": "agent:main:on-the-node"}))["session"][
        "placement"
    ]["state"] != "active":
        assert time.monotonic() < deadline, placed
        time.sleep(0.1)
    kept = node_disk(node_host)
    assert kept["workspaces"] and kept["environments"] and kept["bundles"], kept
    return kept


def wait_for_removal_cleanup(node_host, kept: dict[str, list[str]]) -> None:
    deadline = time.monotonic() + 30
    while not node_host.journal("pairing-removed"):
        assert time.monotonic() < deadline, node_host.log()
        time.sleep(0.1)
    assert node_disk(node_host) == {"workspaces": [], "environments": [], "bundles": [], "blobs": []}
    assert node_host.journal("pairing-removed")[0]["deleted"]["environments"] == kept["workspaces"]
    assert IdentityStore(node_host.state_dir).device_token("node") is None


def test_a_node_holding_only_its_device_token_cleans_its_disk_when_removed_while_connected(gateway_factory):
    """Issue 26 "a removed node leaves nothing behind", for a node without the shared secret: its device token is
    its only credential, so after the removal every connect is refused as a token mismatch and it would never hear
    NOT_PAIRED. The removal's close (4001 `device removed`, workers.md §5.4) tells it at once."""
    gateway = gateway_factory()
    node_host = start_node_host(gateway, capacity=2)
    try:
        call_once(gateway, "node.pair.approve", {"requestId": node_host.pairing_request()})
        node_id = node_row(gateway, until=hosting)["nodeId"]
        assert node_host.stop() == 0
        del node_host.env["OPENCLAW_GATEWAY_TOKEN"]  # from now on it connects with its device token alone
        node_host.start_again()
        node_row(gateway, until=hosting)
        kept = place_a_session_on(gateway, node_host, node_id)

        call_once(gateway, "node.pair.remove", {"nodeId": node_id})

        wait_for_removal_cleanup(node_host, kept)
    finally:
        exit_code = node_host.stop()
        node_host_log = node_host.log()
        node_host.remove_state()
    assert exit_code == 0, node_host_log


def test_a_node_offline_at_its_removal_deletes_what_the_gateway_left_on_it_when_it_comes_back(gateway_factory):
    """Issue 26 "a removed node leaves nothing behind", for a node the gateway cannot tell: removed while it was
    stopped, it learns at its next connect (answered NOT_PAIRED) and deletes that gateway's workspaces,
    environment records, bundles and content, then asks to be paired anew."""
    gateway = gateway_factory()
    node_host = start_node_host(gateway, capacity=2)
    try:
        call_once(gateway, "node.pair.approve", {"requestId": node_host.pairing_request()})
        node_id = node_row(gateway, until=hosting)["nodeId"]
        kept = place_a_session_on(gateway, node_host, node_id)
        assert node_host.stop() == 0

        call_once(gateway, "node.pair.remove", {"nodeId": node_id})
        node_host.start_again()
        # Its node token is forgotten too: it waits for a new approval, as a node never paired here does.
        wait_for_removal_cleanup(node_host, kept)
    finally:
        exit_code = node_host.stop()
        node_host_log = node_host.log()
        node_host.remove_state()
    assert exit_code == 0, node_host_log


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--capacity", "0"], "--capacity must be between 1 and 1024"),
        (["--capacity", "1025"], "--capacity must be between 1 and 1024"),
        (["--capacity-wait-ms", "-1"], "--capacity-wait-ms must not be negative"),
    ],
)
def test_bad_arguments_stop_the_node_host_with_one_clear_line(tmp_path, arguments, message):
    base = [sys.executable, "-m", "openclaw_client.node", "--gateway", "ws://127.0.0.1:1", "--state-dir", str(tmp_path)]
    result = subprocess.run(
        [*base, *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"openclaw-node: error: {message}"


def test_manage_py_node_is_the_same_program_with_this_project_s_defaults(tmp_path):
    result = subprocess.run(
        [sys.executable, "manage.py", "node", "--capacity", "0"],
        cwd=ROOT,
        env={**os.environ, "OPENCLAW_STATE_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "openclaw-node: error: --capacity must be between 1 and 1024" in result.stderr
