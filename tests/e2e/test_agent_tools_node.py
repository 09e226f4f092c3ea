"""Agent turns that act, on a session placed on a paired node host process: the tools run in the node's
workspace of the environment (not the gateway's worktree), every step reaches the gateway's transcript,
the node's changes come back to the worktree when the session moves back, an ``exec`` the policy asks about
waits for an operator on another connection, and ``chat.abort`` kills the command on the node.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.e2e.test_agent_tools import APPROVALS, _exists, _gone, next_event, plan, tool_results
from tests.e2e.test_node_turns import dispatched
from tests.e2e.test_seed_004_paired_node_worker_lifecycle import eventually, message_text
from tests.support.clients import operator

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

AGENT = "qa"  # the agent of the sessions the placed fixture's helpers create


def node_workspace(node_host, environment_id: str) -> Path:
    return Path(node_host.state_dir) / "workspaces" / environment_id


def node_id_of_host(node_host) -> str:
    return json.loads((Path(node_host.state_dir) / "identity" / "device.json").read_text())["deviceId"]


async def set_node_policy(client, node_id: str, agent: dict) -> None:
    current = await client.request("exec.approvals.node.get", {"nodeId": node_id})
    params = {"nodeId": node_id, "file": {"version": 1, "agents": {AGENT: agent}}}
    if current["exists"]:
        params["baseHash"] = current["hash"]
    await client.request("exec.approvals.node.set", params)


async def send(wire, key: str, message: str, run_id: str) -> str:
    started = await wire.client.request("chat.send", {"sessionKey": key, "message": message, "idempotencyKey": run_id})
    return started["runId"]


def test_the_tools_of_a_node_session_run_in_the_nodes_workspace(placed):
    """Edit and run on the node; the change reaches the worktree when the session moves back, where ``git diff``
    shows it (the node holds the environment's files, not the repository: git runs on the gateway's side)."""
    gateway, node_host, published = placed

    async def scenario():
        client, wire, key = await dispatched(gateway, node_host, published, "tools")
        try:
            # grep may run on this node without asking, git on the gateway; nothing else runs unasked.
            allow = {"security": "allowlist", "ask": "on-miss"}
            await set_node_policy(client, node_id_of_host(node_host), {**allow, "allowlist": [{"pattern": "grep"}]})
            await client.request(
                "exec.approvals.set",
                {"file": {"version": 1, "agents": {AGENT: {**allow, "allowlist": [{"pattern": "git"}]}}}},
            )
            placement = await wire.describe_placement(key)
            workspace = node_workspace(node_host, placement["environmentId"])
            edit = {"path": "README.md", "edits": [{"oldText": "published", "newText": "edited on the node"}]}
            message = plan(
                [{"name": "edit", "arguments": edit}],
                [{"name": "exec", "arguments": {"command": "grep -n edited README.md"}}],
            )
            waited = await wire.wait_for_turn(await send(wire, key, message, "node-tools-1"))
            assert waited["status"] == "ok", waited
            assert (workspace / "README.md").read_text() == "edited on the node workspace\n"

            messages = await wire.history(key)
            roles = [m["role"] for m in messages]
            assert roles == ["user", "assistant", "toolResult", "assistant", "toolResult", "assistant"], roles
            found = tool_results(messages)[1]
            assert not found["isError"] and found["details"]["exitCode"] == 0, found
            assert "1:edited on the node workspace" in message_text(found)
            assert found["details"]["cwd"] == str(workspace.resolve())
            assert "edited on the node workspace" in message_text(messages[-1])

            # The gateway's worktree has not changed while the session is on the node; it has once it is back.
            described = await wire.client.request("sessions.describe", {"key": key})
            worktree = Path(gateway.state_dir) / described["session"]["worktree"]["path"]
            assert "edited" not in (worktree / "README.md").read_text()
            await wire.move_to_gateway(key)
            await eventually(lambda: _edited(worktree / "README.md"))
            diffed = plan([{"name": "exec", "arguments": {"command": "git diff"}}])
            waited = await wire.wait_for_turn(await send(wire, key, diffed, "node-tools-2"))
            assert waited["status"] == "ok", waited
            diff = tool_results(await wire.history(key))[-1]
            assert not diff["isError"] and "+edited on the node workspace" in message_text(diff), diff
            assert diff["details"]["cwd"] == str(worktree.resolve())
        finally:
            await client.close()

    asyncio.run(scenario())


async def _edited(path: Path) -> None:
    assert "edited on the node" in await asyncio.to_thread(path.read_text)


def test_an_exec_on_a_node_waits_for_an_operators_decision(placed):
    gateway, node_host, published = placed

    async def scenario():
        client, wire, key = await dispatched(gateway, node_host, published, "ask")
        approver = operator(gateway, scopes=APPROVALS)
        await approver.connect()
        try:
            placement = await wire.describe_placement(key)
            workspace = node_workspace(node_host, placement["environmentId"])
            run_id = await send(
                wire, key, plan([{"name": "exec", "arguments": {"command": "echo yes > proof"}}]), "node-ask-1"
            )
            requested = await next_event(approver, "exec.approval.requested")
            request = requested["request"]
            assert request["host"] == "node" and request["nodeId"] == node_id_of_host(node_host)
            assert request["command"] == "echo yes > proof" and request["cwd"] == str(workspace.resolve())
            assert request["runId"] == run_id and request["agentId"] == AGENT
            assert not (workspace / "proof").exists()
            await approver.request("exec.approval.resolve", {"id": requested["id"], "decision": "allow-once"})
            waited = await wire.wait_for_turn(run_id)
            assert waited["status"] == "ok", waited
            assert (workspace / "proof").read_text() == "yes\n"
        finally:
            await approver.close()
            await client.close()

    asyncio.run(scenario())


def test_an_abort_kills_the_command_on_the_node(placed):
    gateway, node_host, published = placed

    async def scenario():
        client, wire, key = await dispatched(gateway, node_host, published, "abort-exec")
        try:
            await set_node_policy(client, node_id_of_host(node_host), {"security": "full", "ask": "off"})
            await client.request(
                "exec.approvals.set", {"file": {"version": 1, "agents": {AGENT: {"security": "full", "ask": "off"}}}}
            )
            placement = await wire.describe_placement(key)
            workspace = node_workspace(node_host, placement["environmentId"])
            command = "echo $$ > shell.pid; sleep 60 & echo $! > child.pid; wait; touch finished"
            run_id = await send(wire, key, plan([{"name": "exec", "arguments": {"command": command}}]), "node-abort-1")
            await eventually(lambda: _exists(workspace / "child.pid"))
            await client.request("chat.abort", {"sessionKey": key, "runId": run_id})
            waited = await wire.wait_for_turn(run_id)
            assert waited.get("aborted") is True, waited
            for pid_file in ("shell.pid", "child.pid"):
                pid = int((workspace / pid_file).read_text())
                await eventually(lambda pid=pid: _gone(pid))
            assert not (workspace / "finished").exists()
            # The slot is free again (capacity 1): the next turn runs.
            await wire.expect_successful_turn(key, "AFTER-ABORTED-EXEC")
        finally:
            await client.close()

    asyncio.run(scenario())


def test_a_node_session_is_confined_to_its_workspace_and_its_commands_see_no_secret(placed):
    gateway, node_host, published = placed

    async def scenario():
        client, wire, key = await dispatched(gateway, node_host, published, "confined")
        try:
            await set_node_policy(client, node_id_of_host(node_host), {"security": "full", "ask": "off"})
            await client.request(
                "exec.approvals.set", {"file": {"version": 1, "agents": {AGENT: {"security": "full", "ask": "off"}}}}
            )
            message = plan(
                [
                    {"name": "read", "arguments": {"path": "../../identity/device.json"}},
                    {
                        "name": "read",
                        "arguments": {"path": str(Path(node_host.state_dir) / "identity" / "device.json")},
                    },
                    {"name": "ls", "arguments": {"path": ".."}},
                    {"name": "exec", "arguments": {"command": "env", "workdir": "../.."}},
                ],
                [{"name": "exec", "arguments": {"command": "env"}}],
            )
            waited = await wire.wait_for_turn(await send(wire, key, message, "node-confined-1"))
            assert waited["status"] == "ok", waited
            results = tool_results(await wire.history(key))
            assert [r["isError"] for r in results] == [True, True, True, True, False]
            assert all("outside the workspace" in message_text(r) for r in results[:4])
            environment = message_text(results[4])
            for secret in (gateway.token, "sk-test", "OPENCLAW_GATEWAY_TOKEN", "privateKey"):
                assert secret not in environment
        finally:
            await client.close()

    asyncio.run(scenario())
