"""Commands typed into chat.send, over real websockets against a real gateway process whose model is the real mock
OpenAI server: /status, /model, /help, /new and /reset are answered by the gateway (the reply is the run's one
``chat`` final event, for the sender and for subscribers), never by the model; the model's request log shows only
the ordinary turn, and that turn's context leaves the commands out."""

from __future__ import annotations

import asyncio

import pytest

from openclaw_client.client import GatewayError
from tests.support.clients import operator

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _reply(frame: dict) -> str:
    return frame["payload"]["message"]["content"][0]["text"]


async def _command(client, key: str, message: str, run_id: str) -> tuple[dict, dict]:
    """chat.send, then the run's terminal ``chat`` event as the sender receives it."""
    ack = await client.request("chat.send", {"sessionKey": key, "message": message, "idempotencyKey": run_id})
    final = await client.next_event(
        "chat", predicate=lambda f: f["payload"]["runId"] == run_id and f["payload"]["state"] != "delta"
    )
    return ack, final


def test_commands_are_answered_by_the_gateway_and_never_reach_the_model(model_gateway, mock_openai):
    async def scenario():
        sender = operator(model_gateway)
        observer = operator(model_gateway, scopes=["operator.read"])
        await sender.connect()
        await observer.connect()
        await observer.request("sessions.subscribe", {})
        key = (await sender.request("sessions.create", {"key": "commands"}))["key"]
        before = (await sender.request("sessions.describe", {"key": key}))["session"]

        status_ack, status = await _command(sender, key, "/status", "c-status")
        watched = await observer.next_event("chat", predicate=lambda f: f["payload"]["runId"] == "c-status")
        waited = await sender.request("agent.wait", {"runId": "c-status", "timeoutMs": 10_000})
        _, model = await _command(sender, key, "/model openai/gpt-e2e", "c-model")
        _, helped = await _command(sender, key, "/help", "c-help")
        await sender.request("chat.send", {"sessionKey": key, "message": "Reply exactly: HI", "idempotencyKey": "t1"})
        turn = await sender.request("agent.wait", {"runId": "t1", "timeoutMs": 20_000})
        kept = await sender.request("chat.history", {"sessionKey": key})
        _, renewed = await _command(sender, key, "/new", "c-new")
        changed = await observer.next_event("sessions.changed", predicate=lambda f: f["payload"].get("reason") == "new")
        after = (await sender.request("sessions.describe", {"key": key}))["session"]
        fresh = await sender.request("chat.history", {"sessionKey": key})
        runs_of_commands = [
            f["payload"]["runId"]
            for f in sender.drain_events()
            if f["event"] == "agent" and f["payload"]["runId"].startswith("c-")
        ]
        await sender.close()
        await observer.close()
        return locals()

    seen = asyncio.run(scenario())
    assert seen["status_ack"] == {"runId": "c-status", "status": "started"}
    status = seen["status"]["payload"]
    assert (status["state"], status["seq"], status["sessionKey"]) == ("final", 1, seen["key"])
    assert "🧠 Model: openai/mock-model (configured default)" in _reply(seen["status"])
    assert f"🧵 Session: {seen['key']} · id {seen['before']['sessionId']}" in _reply(seen["status"])
    assert status["message"]["model"] == "gateway-injected" and status["message"]["excludeFromContext"] is True
    assert seen["watched"]["payload"] == status  # a subscriber sees the same reply
    assert seen["waited"]["status"] == "ok" and seen["waited"]["outputText"] == _reply(seen["status"])
    assert _reply(seen["model"]) == "Model set to openai/gpt-e2e for this session only; configured default unchanged."
    assert "/new [message]  |  /reset [message]" in _reply(seen["helped"])
    assert seen["runs_of_commands"] == []  # a command is no agent run: no agent events

    # The one model call is the ordinary turn: on the model /model chose, without the commands in its context.
    assert seen["turn"]["outputText"] == "HI"
    assert [r["model"] for r in mock_openai.requests] == ["gpt-e2e"]
    assert mock_openai.requests[0]["messages"] == [{"role": "user", "content": "Reply exactly: HI"}]
    shown = [(m["role"], m["content"][0]["text"]) for m in seen["kept"]["messages"]]
    assert [text for _, text in shown][0::2] == ["/status", "/model openai/gpt-e2e", "/help", "Reply exactly: HI"]

    assert _reply(seen["renewed"]) == "✅ New session started."
    assert seen["after"]["sessionId"] != seen["before"]["sessionId"]
    assert seen["changed"]["payload"]["sessionId"] == seen["after"]["sessionId"]
    assert [(m["role"], m["content"][0]["text"]) for m in seen["fresh"]["messages"]] == [
        ("user", "/new"),
        ("assistant", "✅ New session started."),
    ]


def test_a_reset_needs_operator_admin_and_a_command_needs_operator_write(model_gateway, mock_openai):
    async def scenario():
        admin = operator(model_gateway)
        writer = operator(model_gateway, scopes=["operator.read", "operator.write"])
        reader = operator(model_gateway, scopes=["operator.read"])
        for client in (admin, writer, reader):
            await client.connect()
        key = (await admin.request("sessions.create", {"key": "guarded"}))["key"]
        before = (await admin.request("sessions.describe", {"key": key}))["session"]
        _, refused = await _command(writer, key, "/reset", "w-reset")
        _, allowed = await _command(writer, key, "/status", "w-status")
        with pytest.raises(GatewayError) as unwritable:
            await reader.request("chat.send", {"sessionKey": key, "message": "/status", "idempotencyKey": "r-1"})
        after = (await admin.request("sessions.describe", {"key": key}))["session"]
        for client in (admin, writer, reader):
            await client.close()
        return before, refused, allowed, unwritable.value, after

    before, refused, allowed, unwritable, after = asyncio.run(scenario())
    assert _reply(refused).startswith("⚠️ You are not authorized to reset this session: resets need operator.admin.")
    assert after["sessionId"] == before["sessionId"]
    assert _reply(allowed).startswith("🦞 OpenClaw gateway")
    assert unwritable.code == "INVALID_REQUEST" and "operator.write" in unwritable.message
    assert mock_openai.requests == []


def test_reset_during_a_turn_aborts_it_and_the_fresh_transcript_takes_turns_at_once(model_gateway, mock_openai):
    mock_openai.hold("HOLD-RESET")

    async def scenario():
        client = operator(model_gateway)
        await client.connect()
        key = (await client.request("sessions.create", {"key": "busy"}))["key"]
        before = (await client.request("sessions.describe", {"key": key}))["session"]
        await client.request("chat.send", {"sessionKey": key, "message": "HOLD-RESET now", "idempotencyKey": "t1"})
        async with asyncio.timeout(20):
            while "HOLD-RESET" not in mock_openai.held():  # the turn is running: its model call is held
                await asyncio.sleep(0.05)
        await client.request("chat.send", {"sessionKey": key, "message": "/reset", "idempotencyKey": "c-reset"})
        ends = {}  # the terminal chat event of the held turn and the command's reply, in whichever order they come
        while len(ends) < 2:
            frame = await client.next_event(
                "chat",
                predicate=lambda f: f["payload"]["runId"] in ("t1", "c-reset") and f["payload"]["state"] != "delta",
            )
            ends[frame["payload"]["runId"]] = frame
        reset, aborted = ends["c-reset"], ends["t1"]
        stopped = await client.request("agent.wait", {"runId": "t1", "timeoutMs": 10_000})
        await client.request(
            "chat.send", {"sessionKey": key, "message": "Reply exactly: AFTER", "idempotencyKey": "t2"}
        )
        after = await client.request("agent.wait", {"runId": "t2", "timeoutMs": 20_000})
        history = await client.request("chat.history", {"sessionKey": key})
        renewed = (await client.request("sessions.describe", {"key": key}))["session"]
        await client.close()
        return before, reset, aborted, stopped, after, history, renewed

    try:
        before, reset, aborted, stopped, after, history, renewed = asyncio.run(scenario())
    finally:
        mock_openai.release()
    assert _reply(reset) == "✅ Session reset."
    assert aborted["payload"]["state"] == "aborted"
    assert stopped["status"] == "error" and stopped.get("aborted") is True
    assert after["status"] == "ok" and after["outputText"] == "AFTER"
    assert renewed["sessionId"] != before["sessionId"]
    assert mock_openai.requests[-1]["messages"] == [{"role": "user", "content": "Reply exactly: AFTER"}]
    assert [(m["role"], m["content"][0]["text"]) for m in history["messages"]] == [
        ("user", "/reset"),
        ("assistant", "✅ Session reset."),
        ("user", "Reply exactly: AFTER"),
        ("assistant", "AFTER"),
    ]
