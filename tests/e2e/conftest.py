"""Fixtures of the end-to-end tests shared by several modules."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.e2e.test_seed_004_paired_node_worker_lifecycle import model_env, publish_workspace
from tests.support.clients import call_once
from tests.support.processes import start_node_host


@pytest.fixture
def placed(gateway_factory, mock_openai, tmp_path):
    """A gateway, a paired node host process, and a worktree session dispatched to it."""
    workspace_root = tmp_path / "allowed"
    workspace_root.mkdir()
    published = publish_workspace(workspace_root)
    gateway = gateway_factory(extra_env=model_env(mock_openai, workspace_root))
    node_host = start_node_host(gateway, capacity=1, capacity_wait_ms=500)
    call_once(gateway, "node.pair.approve", {"requestId": node_host.pairing_request()})
    try:
        yield gateway, node_host, published
    finally:
        mock_openai.release()
        node_host.stop()
        node_host.remove_state()


OPENCLAW_WORKER_HOST_CONFIG = {"nodeHost": {"workerRuns": {"enabled": True, "capacity": 2}}}


@pytest.fixture
def node_home():
    """A persistent OPENCLAW_NODE_HOME for OpenClaw's node host, configured to host worker runs; removed after."""
    home = Path(tempfile.mkdtemp(prefix="openclaw-node-home-"))
    (home / ".openclaw").mkdir()
    (home / ".openclaw" / "openclaw.json").write_text(json.dumps(OPENCLAW_WORKER_HOST_CONFIG))
    yield home
    shutil.rmtree(home, ignore_errors=True)
