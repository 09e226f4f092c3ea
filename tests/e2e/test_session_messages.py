"""OpenClaw's Control UI chat page over the real wire, against a real gateway process: ``chat.startup``,
``sessions.resolve`` of a chat link's short id, and ``sessions.messages.subscribe`` — its ``session.message``
events reach the subscribed connection for the subscribed session only, stop after ``unsubscribe`` and never
reach other connections; with the mock model scripting an ``exec`` that asks, ``session.tool`` and
``session.approval`` (``includeApprovals``) come too."""

from __future__ import annotations

import asyncio
import time

import pytest

from openclaw_client.client import GatewayError
from tests.e2e.test_agent_tools import APPROVALS, TURN_TIMEOUT_MS, model_env, plan
from tests.support.clients import operator

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PER_SESSION = ("session.message", "session.tool", "session.approval")


async def connected(gateway, **kwargs):
    client = operator(gateway, **kwargs)
    await client.connect()
    return client


async def turn(client, key: str, message: str, run_id: str) -> dict:
    await client.request("chat.send", {"sessionKey": key, "message": message, "idempotencyKey": run_id})
    return await client.request(
        "agent.wait", {"runId": run_id, "timeoutMs": TURN_TIMEOUT_MS}, timeout=TURN_TIMEOUT_MS / 1000 + 5
    )


async def per_session_events(client, *, settle: float = 0.5) -> list[dict]:
    """The per-session events this connection received, after a pause for any still on their way."""
    await asyncio.sleep(settle)
    return [frame for frame in client.drain_events() if frame["event"] in PER_SESSION]


async def until(client, event: str, kept: list[dict], *, timeout: float = 30) -> dict:
    """The next ``event``'s payload; every per-session event received on the way is kept in ``kept``."""
    async with asyncio.timeout(timeout):
        while True:
            frame = await client.events.get()
            if frame["event"] in PER_SESSION:
                kept.append(frame)
            if frame["event"] == event:
                return frame["payload"]


def texts(frames: list[dict]) -> list[tuple[str, str]]:
    return [(f["payload"]["message"]["role"], f["payload"]["message"]["content"][0]["text"]) for f in frames]


async def refused(client, method: str, params: dict) -> str:
    with pytest.raises(GatewayError) as error:
        await client.request(method, params)
    assert error.value.code == "INVALID_REQUEST"
    return error.value.message


def test_messages_reach_the_subscribed_connection_for_its_session_only(gateway):
    async def scenario():
        watcher, bystander = await connected(gateway), await connected(gateway)
        try:
            watched = (await watcher.request("sessions.create", {"label": "Watched work"}))["key"]
            other = (await watcher.request("sessions.create", {"key": "not-watched"}))["key"]
            assert await watcher.request("sessions.messages.subscribe", {"key": watched, "includeApprovals": True}) == {
                "subscribed": True,
                "key": watched,
                "approvalReplay": {
                    "sessionKey": watched,
                    "updatedAtMs": pytest.approx(time.time() * 1000, abs=60_000),
                    "approvals": [],
                    "truncated": False,
                },
            }
            assert (await turn(watcher, watched, "Reply exactly: ONE", "w-1"))["status"] == "ok"
            assert (await turn(watcher, other, "Reply exactly: ELSEWHERE", "o-1"))["status"] == "ok"
            seen = await per_session_events(watcher)
            assert [f["event"] for f in seen] == ["session.message", "session.message"]
            assert texts(seen) == [("user", "Reply exactly: ONE"), ("assistant", "ONE")]
            user, reply = (f["payload"] for f in seen)
            assert {user["sessionKey"], reply["sessionKey"]} == {watched}
            assert (user["messageSeq"], reply["messageSeq"], reply["runId"]) == (1, 2, "w-1")
            assert reply["message"]["__openclaw"] == {"id": reply["messageId"], "seq": 2}
            assert reply["agentId"] == "main" and reply["label"] == "Watched work"
            assert await per_session_events(bystander, settle=0) == []  # never subscribed: nothing

            # The page the chat opens with shows what the events showed.
            startup = await watcher.request("chat.startup", {"sessionKey": watched, "limit": 80, "maxBytes": 262144})
            assert [m["__openclaw"]["id"] for m in startup["messages"]] == [user["messageId"], reply["messageId"]]
            assert startup["sessionInfo"]["key"] == watched and startup["sessionInfo"]["hasActiveRun"] is False

            # The chat link /chat/main/watched-work-<8 hex> resolves, and opens by itself.
            short_id = watched.rsplit(":", 1)[1].replace("-", "")[:8]
            resolved = await watcher.request(
                "sessions.resolve", {"shortId": short_id, "agentId": "main", "allowMissing": True}
            )
            assert resolved == {"ok": True, "key": watched, "agentId": "main", "displayName": "Watched work"}
            linked = await watcher.request(
                "chat.startup", {"shortId": short_id, "slugHint": "watched-work", "agentId": "main"}
            )
            assert linked["resolution"] == resolved and len(linked["messages"]) == 2
            assert await watcher.request(
                "sessions.resolve", {"shortId": "00000000", "agentId": "main", "allowMissing": True}
            ) == {"ok": False}
            assert await refused(watcher, "sessions.resolve", {"shortId": "00000000", "agentId": "main"}) == (
                "No session found: 00000000"
            )
            assert (
                await refused(watcher, "chat.startup", {"sessionKey": "nowhere"})
                == "session not found: agent:main:nowhere"
            )
            assert (await refused(watcher, "sessions.messages.subscribe", {"key": watched, "since": 1})).endswith(
                "at /since: unexpected property"
            )

            # Another connection follows the other session: it gets that session's messages, the watcher does not.
            await bystander.request("sessions.messages.subscribe", {"key": other})
            assert (await turn(bystander, other, "Reply exactly: TWO", "o-2"))["status"] == "ok"
            assert texts(await per_session_events(bystander)) == [("user", "Reply exactly: TWO"), ("assistant", "TWO")]
            assert await per_session_events(watcher, settle=0) == []

            # Unsubscribed (twice: the same answer), nothing more comes.
            for _ in range(2):
                assert await watcher.request("sessions.messages.unsubscribe", {"key": watched}) == {
                    "subscribed": False,
                    "key": watched,
                }
            assert (await turn(watcher, watched, "Reply exactly: AFTER", "w-2"))["status"] == "ok"
            assert await per_session_events(watcher) == []
        finally:
            await watcher.close()
            await bystander.close()

    asyncio.run(scenario())


def test_a_subscription_ends_with_its_connection(gateway):
    async def scenario():
        first = await connected(gateway)
        key = (await first.request("sessions.create", {"key": "ends-with-socket"}))["key"]
        await first.request("sessions.messages.subscribe", {"key": key})
        await first.close()
        second = await connected(gateway)
        try:
            assert (await turn(second, key, "Reply exactly: LATER", "end-1"))["status"] == "ok"
            assert await per_session_events(second) == []
        finally:
            await second.close()

    asyncio.run(scenario())


def test_tool_calls_and_approvals_of_the_session_come_to_its_subscriber(gateway_factory, mock_openai, tmp_path):
    root = tmp_path / "allowed"
    root.mkdir()
    gateway = gateway_factory(extra_env=model_env(mock_openai, root))

    async def scenario():
        approver = await connected(gateway, scopes=APPROVALS)
        reader = await connected(gateway, scopes=["operator.read"])
        try:
            assert await refused(reader, "sessions.messages.subscribe", {"key": "main", "includeApprovals": True}) == (
                "sessions.messages.subscribe includeApprovals requires a paired device and gateway scope: "
                "operator.approvals"
            )
            subscribed = await approver.request(
                "sessions.messages.subscribe", {"key": "main", "includeApprovals": True}
            )
            assert subscribed["key"] == "agent:main:main" and subscribed["approvalReplay"]["approvals"] == []
            await approver.request(
                "chat.send",
                {
                    "sessionKey": "main",
                    "message": plan([{"name": "exec", "arguments": {"command": "echo hi > asked"}}], final="went on"),
                    "idempotencyKey": "tool-1",
                },
            )
            seen: list[dict] = []
            pending = await until(approver, "session.approval", seen)
            assert (pending["sessionKey"], pending["phase"]) == ("agent:main:main", "pending")
            approval = pending["approval"]
            assert approval["status"] == "pending" and approval["presentation"]["commandText"] == "echo hi > asked"
            assert approval["urlPath"] == f"/approve/{approval['id']}"
            await approver.request("exec.approval.resolve", {"id": approval["id"], "decision": "deny"})
            terminal = await until(approver, "session.approval", seen)
            assert terminal["phase"] == "terminal" and terminal["approval"]["id"] == approval["id"]
            assert terminal["approval"]["decision"] == "deny"
            waited = await approver.request(
                "agent.wait", {"runId": "tool-1", "timeoutMs": TURN_TIMEOUT_MS}, timeout=TURN_TIMEOUT_MS / 1000 + 5
            )
            assert waited["status"] == "ok", waited
            seen += await per_session_events(approver)
            tools = [f["payload"] for f in seen if f["event"] == "session.tool"]
            assert [(t["stream"], t["data"]["phase"], t["data"]["name"]) for t in tools] == [
                ("tool", "start", "exec"),
                ("tool", "result", "exec"),
            ]
            assert tools[1]["data"]["isError"] is True and tools[0]["sessionKey"] == "agent:main:main"
            assert tools[0]["runId"] == "tool-1" and tools[0]["data"]["toolCallId"] == tools[1]["data"]["toolCallId"]
            roles = [f["payload"]["message"]["role"] for f in seen if f["event"] == "session.message"]
            assert roles == ["user", "assistant", "toolResult", "assistant"], roles
            assert await per_session_events(reader, settle=0) == []
        finally:
            await approver.close()
            await reader.close()

    asyncio.run(scenario())
