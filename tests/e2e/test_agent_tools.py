"""Agent turns that act, over real processes and the real wire (a gateway, its Celery worker when Redis is
there, the mock OpenAI model scripting tool calls with ``TOOL_PLAN``): a local session edits a file in its
worktree and runs ``git diff`` through ``exec``; an ``exec`` the policy asks about waits for an operator's
decision given from a second connection (allow, deny, expiry); ``chat.abort`` kills a running command; and
the safety rules hold end to end (paths confined to the workspace, no secret in the command's environment).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_seed_004_paired_node_worker_lifecycle import eventually, message_text, publish_workspace
from tests.support.clients import operator

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

TURN_TIMEOUT_MS = 60_000
APPROVALS = ["operator.read", "operator.write", "operator.approvals"]


def plan(*steps: list[dict[str, Any]], final: str = "done: {last_tool_result}") -> str:
    """A user message the mock model answers with these tool calls, step by step, then ``final``."""
    return "TOOL_PLAN: " + json.dumps({"steps": [{"calls": calls} for calls in steps], "final": final})


def model_env(mock, root: Path, **extra: str) -> dict[str, str]:
    return {
        "OPENCLAW_MODEL_BASE_URL": mock.base_url,
        "OPENCLAW_MODEL_API_KEY": "sk-test-secret",
        "OPENCLAW_MODEL": "mock-model",
        "OPENCLAW_MODEL_READ_TIMEOUT_S": "30",
        "OPENCLAW_WORKSPACE_ROOTS": str(root),
        **extra,
    }


@pytest.fixture
def root(tmp_path) -> Path:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    return allowed


class Operator:
    """One operator connection, with the calls the scenarios make."""

    def __init__(self, client):
        self.client = client

    async def set_policy(self, agent: dict[str, Any]) -> None:
        current = await self.client.request("exec.approvals.get", {})
        params: dict[str, Any] = {"file": {"version": 1, "agents": {"main": agent}}}
        if current["exists"]:
            params["baseHash"] = current["hash"]
        await self.client.request("exec.approvals.set", params)

    async def worktree_session(self, published: Path, name: str, state_dir: str) -> tuple[str, Path]:
        created = await self.client.request(
            "sessions.create",
            {"key": name, "worktree": True, "worktreeName": name, "worktreeBaseRef": "main", "cwd": str(published)},
        )
        # Clients see the worktree's path relative to the gateway's state directory.
        return created["key"], Path(state_dir) / created["worktree"]["path"]

    async def send(self, key: str, message: str, run_id: str) -> str:
        started = await self.client.request(
            "chat.send", {"sessionKey": key, "message": message, "idempotencyKey": run_id}
        )
        return started["runId"]

    async def wait(self, run_id: str) -> dict[str, Any]:
        return await self.client.request(
            "agent.wait", {"runId": run_id, "timeoutMs": TURN_TIMEOUT_MS}, timeout=TURN_TIMEOUT_MS / 1000 + 5
        )

    async def history(self, key: str) -> list[dict[str, Any]]:
        return (await self.client.request("chat.history", {"sessionKey": key, "limit": 200}))["messages"]


async def connected(gateway, **kwargs) -> Operator:
    client = operator(gateway, **kwargs)
    await client.connect()
    return Operator(client)


def tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in messages if m.get("role") == "toolResult"]


async def next_event(client, name: str, *, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        frame = await asyncio.wait_for(client.events.get(), max(0.01, deadline - time.monotonic()))
        if frame.get("event") == name:
            return frame["payload"]


def test_a_local_session_edits_its_worktree_and_runs_git_diff(gateway_factory, mock_openai, root):
    published = publish_workspace(root)
    gateway = gateway_factory(extra_env=model_env(mock_openai, root))

    async def scenario():
        admin = await connected(gateway)
        try:
            # git runs without asking (an allowlist entry); anything else would ask.
            await admin.set_policy({"security": "allowlist", "ask": "on-miss", "allowlist": [{"pattern": "git"}]})
            key, worktree = await admin.worktree_session(published, "edits", gateway.state_dir)
            await admin.client.request("sessions.subscribe", {})
            message = plan(
                [
                    {
                        "name": "edit",
                        "arguments": {"path": "README.md", "edits": [{"oldText": "published", "newText": "edited"}]},
                    }
                ],
                [{"name": "exec", "arguments": {"command": "git diff"}}],
            )
            run_id = await admin.send(key, message, "edit-1")
            waited = await admin.wait(run_id)
            assert waited["status"] == "ok", waited
            assert (worktree / "README.md").read_text() == "edited workspace\n"
            assert (published / "README.md").read_text() == "published workspace\n"  # the worktree, not its source

            messages = await admin.history(key)
            roles = [m["role"] for m in messages]
            assert roles == ["user", "assistant", "toolResult", "assistant", "toolResult", "assistant"], roles
            call = messages[3]["content"][-1]
            assert (
                call["type"] == "toolCall" and call["name"] == "exec" and call["arguments"] == {"command": "git diff"}
            )
            diff = tool_results(messages)[1]
            assert diff["toolName"] == "exec" and not diff["isError"] and diff["details"]["exitCode"] == 0
            assert "-published workspace" in message_text(diff) and "+edited workspace" in message_text(diff)
            assert "+edited workspace" in message_text(messages[-1])  # the model was sent the diff

            tool_events = [
                frame["payload"]["data"]
                for frame in admin.client.drain_events()
                if frame.get("event") == "agent" and frame["payload"].get("stream") == "tool"
            ]
            assert [(e["phase"], e["name"]) for e in tool_events] == [
                ("start", "edit"),
                ("result", "edit"),
                ("start", "exec"),
                ("result", "exec"),
            ]
            assert tool_events[3]["result"]["details"]["exitCode"] == 0
        finally:
            await admin.client.close()

    asyncio.run(scenario())


def test_an_exec_that_asks_waits_for_an_operator_on_another_connection(gateway_factory, mock_openai, root):
    gateway = gateway_factory(extra_env=model_env(mock_openai, root))
    workspace = Path(gateway.state_dir) / "workspace"

    async def scenario():
        sender = await connected(gateway, scopes=["operator.read", "operator.write"])
        approver = await connected(gateway, scopes=APPROVALS)
        try:
            run_id = await sender.send(
                "main", plan([{"name": "exec", "arguments": {"command": "echo approved > proof"}}]), "ask-1"
            )
            requested = await next_event(approver.client, "exec.approval.requested")
            request = requested["request"]
            assert request["command"] == "echo approved > proof"
            assert request["cwd"] == str(workspace.resolve())
            assert request["sessionKey"] == "agent:main:main" and request["runId"] == run_id
            assert request["host"] == "gateway"
            assert not (workspace / "proof").exists()  # nothing runs before the decision
            pending = await approver.client.request("exec.approval.list", {})
            assert [item["id"] for item in pending] == [requested["id"]]

            # The sender holds no operator.approvals: it may not decide.
            with pytest.raises(Exception, match=r"operator\.approvals|missing scope"):
                await sender.client.request("exec.approval.resolve", {"id": requested["id"], "decision": "allow-once"})

            resolved = await approver.client.request(
                "exec.approval.resolve", {"id": requested["id"], "decision": "allow-once"}
            )
            assert resolved == {"ok": True}
            waited = await sender.wait(run_id)
            assert waited["status"] == "ok", waited
            assert (workspace / "proof").read_text() == "approved\n"
            result = tool_results(await sender.history("main"))[-1]
            assert not result["isError"] and result["details"]["exitCode"] == 0
        finally:
            await sender.client.close()
            await approver.client.close()

    asyncio.run(scenario())


def test_a_denied_exec_is_a_tool_error_and_the_model_goes_on(gateway_factory, mock_openai, root):
    gateway = gateway_factory(extra_env=model_env(mock_openai, root))
    workspace = Path(gateway.state_dir) / "workspace"

    async def scenario():
        approver = await connected(gateway, scopes=APPROVALS)
        try:
            run_id = await approver.send(
                "main",
                plan([{"name": "exec", "arguments": {"command": "echo no > denied"}}], final="went on"),
                "deny-1",
            )
            requested = await next_event(approver.client, "exec.approval.requested")
            await approver.client.request("exec.approval.resolve", {"id": requested["id"], "decision": "deny"})
            resolved = await next_event(approver.client, "exec.approval.resolved")
            assert resolved["id"] == requested["id"] and resolved["decision"] == "deny"
            waited = await approver.wait(run_id)
            assert waited["status"] == "ok", waited
            messages = await approver.history("main")
            result = tool_results(messages)[-1]
            assert result["isError"] and "denied by an operator" in message_text(result)
            assert message_text(messages[-1]) == "went on"
            assert not (workspace / "denied").exists()
        finally:
            await approver.client.close()

    asyncio.run(scenario())


def test_an_approval_nobody_answers_expires_into_the_fallback(gateway_factory, mock_openai, root):
    gateway = gateway_factory(extra_env=model_env(mock_openai, root, OPENCLAW_EXEC_APPROVAL_TIMEOUT_MS="1500"))
    workspace = Path(gateway.state_dir) / "workspace"

    async def scenario():
        approver = await connected(gateway, scopes=APPROVALS)
        try:
            run_id = await approver.send(
                "main", plan([{"name": "exec", "arguments": {"command": "echo x > expired"}}], final="after"), "exp-1"
            )
            requested = await next_event(approver.client, "exec.approval.requested")
            resolved = await next_event(approver.client, "exec.approval.resolved")
            assert resolved["id"] == requested["id"] and resolved["decision"] is None
            waited = await approver.wait(run_id)
            assert waited["status"] == "ok", waited
            result = tool_results(await approver.history("main"))[-1]
            assert result["isError"] and "denied" in message_text(result)
            assert not (workspace / "expired").exists()
            with pytest.raises(Exception, match="unknown or expired approval id"):
                await approver.client.request(
                    "exec.approval.resolve", {"id": requested["id"], "decision": "allow-once"}
                )
        finally:
            await approver.client.close()

    asyncio.run(scenario())


def test_chat_abort_kills_a_running_command(gateway_factory, mock_openai, root):
    gateway = gateway_factory(extra_env=model_env(mock_openai, root))
    workspace = Path(gateway.state_dir) / "workspace"

    async def scenario():
        admin = await connected(gateway)
        try:
            await admin.set_policy({"security": "full", "ask": "off"})
            command = "echo $$ > shell.pid; sleep 60 & echo $! > child.pid; wait; touch finished"
            run_id = await admin.send("main", plan([{"name": "exec", "arguments": {"command": command}}]), "abort-1")
            await eventually(lambda: _exists(workspace / "child.pid"))
            aborted = await admin.client.request("chat.abort", {"sessionKey": "main", "runId": run_id})
            assert aborted["runIds"] == [run_id]
            waited = await admin.wait(run_id)
            assert waited.get("aborted") is True, waited
            for pid_file in ("shell.pid", "child.pid"):
                pid = int((workspace / pid_file).read_text())
                await eventually(lambda pid=pid: _gone(pid))
            assert not (workspace / "finished").exists()
            result = tool_results(await admin.history("main"))[-1]
            assert result["isError"] and result["details"].get("aborted") is True
        finally:
            await admin.client.close()

    asyncio.run(scenario())


def test_paths_stay_in_the_workspace_and_no_secret_reaches_a_command(gateway_factory, mock_openai, root):
    gateway = gateway_factory(extra_env=model_env(mock_openai, root, DATABASE_URL_HINT="x"))
    outside = root / "outside.txt"
    outside.write_text("secret outside\n")

    async def scenario():
        admin = await connected(gateway)
        try:
            await admin.set_policy({"security": "full", "ask": "off"})
            message = plan(
                [
                    {"name": "read", "arguments": {"path": "../../../../../../../etc/passwd"}},
                    {"name": "read", "arguments": {"path": str(outside)}},
                    {"name": "write", "arguments": {"path": "/tmp/escaped-by-model.txt", "content": "x"}},
                    {"name": "exec", "arguments": {"command": "env", "workdir": ".."}},
                ],
                [{"name": "exec", "arguments": {"command": "env"}}],
            )
            waited = await admin.wait(await admin.send("main", message, "safety-1"))
            assert waited["status"] == "ok", waited
            results = tool_results(await admin.history("main"))
            assert [r["isError"] for r in results] == [True, True, True, True, False]
            assert all("outside the workspace" in message_text(r) for r in results[:4]), [
                message_text(r) for r in results
            ]
            assert not await asyncio.to_thread(Path("/tmp/escaped-by-model.txt").exists)
            environment = message_text(results[4])
            for secret in (gateway.token, "sk-test-secret", "OPENCLAW_GATEWAY_TOKEN", "DATABASE_URL", "REDIS_URL"):
                assert secret not in environment
            assert "PATH=" in environment
        finally:
            await admin.client.close()

    asyncio.run(scenario())


def _written(path: Path) -> bool:
    return path.exists() and bool(path.read_text().strip())


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie does not: this machine's PID 1 may not reap it at once)."""
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


async def _exists(path: Path) -> None:
    assert await asyncio.to_thread(_written, path)


async def _gone(pid: int) -> None:
    assert not await asyncio.to_thread(_running, pid), f"process {pid} still runs"


def test_a_malformed_tool_call_is_answered_to_the_model_and_shown_in_the_transcript(gateway_factory, mock_openai, root):
    gateway = gateway_factory(extra_env=model_env(mock_openai, root))

    async def scenario():
        admin = await connected(gateway)
        try:
            message = plan(
                [
                    {"name": "teleport", "arguments": {"to": "mars"}},
                    {"name": "write", "arguments": '{"path": "a.txt", "content": '},
                    {"name": "write", "arguments": {"path": "a.txt"}},
                ],
                final="carried on",
            )
            waited = await admin.wait(await admin.send("main", message, "malformed-1"))
            assert waited["status"] == "ok", waited
            messages = await admin.history("main")
            calls = messages[1]["content"]
            assert calls[1]["arguments"] == {"raw": '{"path": "a.txt", "content": '}
            results = tool_results(messages)
            assert [r["isError"] for r in results] == [True, True, True]
            assert 'unknown tool "teleport"' in message_text(results[0])
            assert "not valid JSON" in message_text(results[1]) or "invalid" in message_text(results[1]).lower()
            assert '"content"' in message_text(results[2])
            assert message_text(messages[-1]) == "carried on"
        finally:
            await admin.client.close()

    asyncio.run(scenario())


@pytest.mark.redis
def test_a_gateway_restart_while_a_turn_waits_loses_and_duplicates_no_approval(gateway_factory, mock_openai, root):
    """The turn runs in the Celery worker; the gateway process that announced the approval dies; another one
    serves the operator, who finds the same single approval and decides it; the turn goes on."""
    env = model_env(mock_openai, root)
    first = gateway_factory(extra_env=env)
    workspace = Path(first.state_dir) / "workspace"

    async def ask() -> tuple[str, str]:
        approver = await connected(first, scopes=APPROVALS)
        try:
            run_id = await approver.send(
                "main", plan([{"name": "exec", "arguments": {"command": "echo kept > proof"}}]), "restart-1"
            )
            requested = await next_event(approver.client, "exec.approval.requested")
            return run_id, requested["id"]
        finally:
            await approver.client.close()

    run_id, approval_id = asyncio.run(ask())
    first.process.kill()  # the gateway process only: its Celery worker keeps the turn
    first.process.wait()
    second = gateway_factory(extra_env={**env, "OPENCLAW_STATE_DIR": first.state_dir}, worker=False)

    async def decide() -> dict[str, Any]:
        approver = await connected(second, scopes=APPROVALS)
        try:
            pending = await approver.client.request("exec.approval.list", {})
            assert [item["id"] for item in pending] == [approval_id]
            await approver.client.request("exec.approval.resolve", {"id": approval_id, "decision": "allow-once"})
            return await approver.wait(run_id)
        finally:
            await approver.client.close()

    waited = asyncio.run(decide())
    assert waited["status"] == "ok", waited
    assert (workspace / "proof").read_text() == "kept\n"
