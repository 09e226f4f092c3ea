"""Chat turns end to end: chat.send → runner (Celery worker or in-process) → events → agent.wait → history."""

from __future__ import annotations

import asyncio
import itertools
import signal
import time

import pytest

from openclaw_client.client import GatewayError
from sessions_app.models import Run, Session, TranscriptEvent
from tests.support import mock_openai as mock
from tests.support.clients import operator
from tests.support.processes import start_gateway, stop_and_remove

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


async def _session(client, key: str) -> str:
    created = await client.request("sessions.create", {"key": key})
    return created["key"]


def _texts(history: dict) -> list[tuple[str, str]]:
    return [(m["role"], m["content"][0]["text"]) for m in history["messages"]]


def test_send_wait_history_with_the_echo_provider(gateway):
    async def scenario():
        client = operator(gateway)
        await client.connect()
        key = await _session(client, "echo-turn")
        ack = await client.request(
            "chat.send", {"sessionKey": key, "message": "Reply exactly: PING", "idempotencyKey": "run-1"}
        )
        waited = await client.request("agent.wait", {"runId": "run-1", "timeoutMs": 20_000})
        history = await client.request("chat.history", {"sessionKey": key})
        frames = []
        while not client.events.empty():
            frame = client.events.get_nowait()
            if frame["event"] in ("chat", "agent") and frame["payload"]["runId"] == "run-1":
                frames.append(frame)
        await client.close()
        return key, ack, waited, history, frames

    key, ack, waited, history, frames = asyncio.run(scenario())
    assert ack == {"runId": "run-1", "status": "started"}
    assert waited["status"] == "ok"
    assert waited["outputText"] == "PING"
    assert waited["terminalReply"] == {"disposition": "visible", "text": "PING"}
    assert _texts(history) == [("user", "Reply exactly: PING"), ("assistant", "PING")]
    chat = [f["payload"] for f in frames if f["event"] == "chat"]
    agent = [f["payload"] for f in frames if f["event"] == "agent"]
    assert [c["state"] for c in chat] == ["delta", "final"]
    assert chat[-1]["message"]["content"] == [{"type": "text", "text": "PING"}]
    assert [c["seq"] for c in chat] == [1, 2]
    assert agent[0]["stream"] == "lifecycle" and agent[0]["data"]["phase"] == "start"
    assert agent[-1]["stream"] == "lifecycle" and agent[-1]["data"]["phase"] == "end"
    assert [a["seq"] for a in agent] == list(range(1, len(agent) + 1))
    assert all(c["sessionKey"] == key for c in chat)
    run = Run.objects.get(run_id="run-1")
    assert (run.status, run.output_text, run.model_provider) == ("ok", "PING", "echo")
    assert Session.objects.get(key=key).status == "done"


def test_a_repeated_send_is_the_same_run(gateway):
    async def scenario():
        client = operator(gateway)
        await client.connect()
        key = await _session(client, "idempotent")
        params = {"sessionKey": key, "message": "hello there", "idempotencyKey": "same"}
        first = await client.request("chat.send", params)
        again = await client.request("chat.send", params)
        await client.request("agent.wait", {"runId": "same", "timeoutMs": 20_000})
        after = await client.request("chat.send", params)
        with pytest.raises(GatewayError) as other_session:
            await client.request("chat.send", {**params, "sessionKey": await _session(client, "other")})
        history = await client.request("chat.history", {"sessionKey": key})
        await client.close()
        return first, again, after, other_session.value, history

    first, again, after, other_session, history = asyncio.run(scenario())
    assert first == {"runId": "same", "status": "started"}
    assert again["status"] in ("in_flight", "ok")
    assert after == {"runId": "same", "status": "ok"}
    assert other_session.message == "idempotencyKey already used for another session"
    assert _texts(history) == [("user", "hello there"), ("assistant", "hello there")]
    assert Run.objects.count() == 1


def test_invalid_messages_and_sessions_are_refused(gateway):
    async def scenario():
        client = operator(gateway)
        await client.connect()
        key = await _session(client, "strict")
        errors = []
        for params in (
            {"sessionKey": key, "message": "nul\x00byte", "idempotencyKey": "a"},
            {"sessionKey": key, "message": "  \n ", "idempotencyKey": "b"},
            {"sessionKey": "agent:main:missing", "message": "hi", "idempotencyKey": "c"},
            {"sessionKey": key, "message": "hi"},
        ):
            with pytest.raises(GatewayError) as failed:
                await client.request("chat.send", params)
            errors.append(failed.value.message)
        await client.close()
        return errors

    errors = asyncio.run(scenario())
    assert errors[0] == "message must not contain null bytes"
    assert errors[1] == "message or attachment required"
    assert errors[2] == "session not found: agent:main:missing"
    assert errors[3] == "invalid chat.send params: at /idempotencyKey: must have required property"
    assert not Run.objects.exists()
    assert not TranscriptEvent.objects.exists()


def test_the_main_session_exists_on_first_use(gateway):
    async def scenario():
        client = operator(gateway)
        await client.connect()
        await client.request("chat.send", {"sessionKey": "main", "message": "Reply exactly: hi", "idempotencyKey": "m"})
        waited = await client.request("agent.wait", {"runId": "m", "timeoutMs": 20_000})
        described = await client.request("sessions.describe", {"key": "agent:main:main"})
        await client.close()
        return waited, described

    waited, described = asyncio.run(scenario())
    assert waited["status"] == "ok"
    assert described["session"]["key"] == "agent:main:main"


def test_a_pending_session_admits_no_turns(gateway):
    async def scenario():
        client = operator(gateway)
        await client.connect()
        key = await _session(client, "pending")
        from channels.db import database_sync_to_async

        await database_sync_to_async(Session.objects.filter(key=key).update)(initialization_pending=True)
        with pytest.raises(GatewayError) as refused:
            await client.request("chat.send", {"sessionKey": key, "message": "hi", "idempotencyKey": "p"})
        await client.close()
        return key, refused.value

    key, refused = asyncio.run(scenario())
    assert refused.code == "UNAVAILABLE"
    assert refused.message == f"Session {key} is initializing; retry later."
    assert refused.retryable is True
    assert not Run.objects.exists()


def test_concurrent_sends_to_one_session_are_serialized_and_none_is_lost(gateway):
    async def scenario():
        clients = [operator(gateway) for _ in range(3)]
        for client in clients:
            await client.connect()
        key = await _session(clients[0], "busy")
        sends = [
            clients[i % 3].request(
                "chat.send", {"sessionKey": key, "message": f"Reply exactly: answer {i}", "idempotencyKey": f"c{i}"}
            )
            for i in range(8)
        ]
        acks = await asyncio.gather(*sends)
        results = await asyncio.gather(
            *(clients[0].request("agent.wait", {"runId": f"c{i}", "timeoutMs": 60_000}) for i in range(8))
        )
        history = await clients[0].request("chat.history", {"sessionKey": key})
        for client in clients:
            await client.close()
        return acks, results, history

    acks, results, history = asyncio.run(scenario())
    assert all(a["status"] == "started" for a in acks)
    assert [r["status"] for r in results] == ["ok"] * 8
    texts = _texts(history)
    assert len(texts) == 16
    # Strictly alternating: each reply directly follows the message it answers.
    for user, assistant in zip(texts[::2], texts[1::2], strict=True):
        assert user[0] == "user" and assistant[0] == "assistant"
        assert user[1] == f"Reply exactly: {assistant[1]}"
    assert sorted(a for _, a in texts[1::2]) == sorted(f"answer {i}" for i in range(8))
    runs = list(Run.objects.order_by("started_at"))
    for earlier, later in itertools.pairwise(runs):
        assert earlier.ended_at <= later.started_at


def test_agent_wait_times_out_without_a_result(gateway):
    async def scenario():
        client = operator(gateway)
        await client.connect()
        started = time.monotonic()
        waited = await client.request("agent.wait", {"runId": "never-sent", "timeoutMs": 300})
        elapsed = time.monotonic() - started
        await client.close()
        return waited, elapsed

    waited, elapsed = asyncio.run(scenario())
    assert waited == {"runId": "never-sent", "status": "timeout"}
    assert elapsed >= 0.3


# --- with the OpenAI-compatible provider (a real HTTP mock) ----------------------------------


def test_turn_streams_from_the_openai_compatible_provider(model_gateway, mock_openai):
    mock_openai.script(mock.reply("Hello from the mock model", chunk_words=2))

    async def scenario():
        client = operator(model_gateway)
        await client.connect()
        key = await _session(client, "openai")
        await client.request("chat.send", {"sessionKey": key, "message": "Say hello", "idempotencyKey": "o1"})
        waited = await client.request("agent.wait", {"runId": "o1", "timeoutMs": 20_000})
        deltas = []
        while not client.events.empty():
            frame = client.events.get_nowait()
            payload = frame["payload"]
            if frame["event"] == "chat" and payload["runId"] == "o1" and payload["state"] == "delta":
                deltas.append(payload["deltaText"])
        history = await client.request("chat.history", {"sessionKey": key})
        await client.close()
        return waited, deltas, history

    waited, deltas, history = asyncio.run(scenario())
    assert waited["status"] == "ok"
    assert waited["outputText"] == "Hello from the mock model"
    assert "".join(deltas) == "Hello from the mock model" and len(deltas) >= 2
    body = mock_openai.requests[-1]
    assert body["model"] == "mock-model" and body["stream"] is True
    assert body["messages"] == [{"role": "user", "content": "Say hello"}]
    assert mock_openai.request_headers[-1].get("authorization") == "Bearer sk-test"
    assert _texts(history)[-1] == ("assistant", "Hello from the mock model")


def test_the_transcript_is_sent_as_context(model_gateway, mock_openai):
    async def scenario():
        client = operator(model_gateway)
        await client.connect()
        key = await _session(client, "context")
        for index in range(2):
            await client.request(
                "chat.send",
                {"sessionKey": key, "message": f"Reply exactly: turn {index}", "idempotencyKey": f"t{index}"},
            )
            await client.request("agent.wait", {"runId": f"t{index}", "timeoutMs": 20_000})
        await client.close()

    asyncio.run(scenario())
    assert mock_openai.requests[-1]["messages"] == [
        {"role": "user", "content": "Reply exactly: turn 0"},
        {"role": "assistant", "content": "turn 0"},
        {"role": "user", "content": "Reply exactly: turn 1"},
    ]


@pytest.mark.parametrize(
    ("behaviour", "summary", "kind"),
    [
        (mock.error(500, "upstream exploded"), "model provider returned HTTP 500: upstream exploded", "unknown"),
        (mock.error(429, "slow down"), "model provider returned HTTP 429: slow down", "rate_limit"),
        (mock.hang(10), "model provider timed out after 2 s", "timeout"),
        (mock.malformed(), "model provider sent a malformed response", "unknown"),
    ],
)
def test_provider_failures_end_the_run_as_error_with_nothing_half_written(
    model_gateway, mock_openai, behaviour, summary, kind
):
    mock_openai.script(behaviour)

    async def scenario():
        client = operator(model_gateway)
        await client.connect()
        key = await _session(client, "failing")
        await client.request("chat.send", {"sessionKey": key, "message": "hello", "idempotencyKey": "f1"})
        waited = await client.request("agent.wait", {"runId": "f1", "timeoutMs": 30_000})
        error_event = await client.next_event("chat", predicate=lambda f: f["payload"]["state"] == "error", timeout=10)
        history = await client.request("chat.history", {"sessionKey": key})
        resend = await client.request("chat.send", {"sessionKey": key, "message": "hello", "idempotencyKey": "f1"})
        await client.close()
        return waited, error_event, history, resend

    waited, error_event, history, resend = asyncio.run(scenario())
    assert waited["status"] == "error"
    assert waited["error"].startswith(summary)
    assert error_event["payload"]["errorMessage"] == waited["error"]
    assert error_event["payload"]["errorKind"] == kind
    # The user message is kept; no assistant message was written.
    assert _texts(history) == [("user", "hello")]
    assert resend["status"] == "error" and resend["summary"] == waited["error"]


def test_abort_keeps_the_partial_reply(model_gateway, mock_openai):
    mock_openai.script(mock.slow("one two three four five six seven eight nine ten", delay_s=0.3))

    async def scenario():
        client = operator(model_gateway)
        await client.connect()
        key = await _session(client, "abortable")
        await client.request("chat.send", {"sessionKey": key, "message": "count", "idempotencyKey": "a1"})
        await client.next_event("chat", predicate=lambda f: f["payload"]["state"] == "delta", timeout=20)
        aborted = await client.request("chat.abort", {"sessionKey": key})
        waited = await client.request("agent.wait", {"runId": "a1", "timeoutMs": 20_000})
        event = await client.next_event("chat", predicate=lambda f: f["payload"]["state"] == "aborted", timeout=10)
        history = await client.request("chat.history", {"sessionKey": key})
        with pytest.raises(GatewayError) as mismatch:
            await client.request("chat.abort", {"sessionKey": await _session(client, "elsewhere"), "runId": "a1"})
        await client.close()
        return aborted, waited, event, history, mismatch.value

    aborted, waited, event, history, mismatch = asyncio.run(scenario())
    assert aborted == {"ok": True, "aborted": True, "runIds": ["a1"]}
    assert waited["status"] == "error" and waited["aborted"] is True
    partial = waited["outputText"]
    assert partial and "one two three four five six seven eight nine ten".startswith(partial)
    assert partial != "one two three four five six seven eight nine ten"
    assert event["payload"]["stopReason"] == "aborted"
    (_user, assistant) = history["messages"]
    assert assistant["content"][0]["text"] == partial and assistant["stopReason"] == "aborted"
    assert mismatch.message == "runId does not match sessionKey"
    assert Run.objects.get(run_id="a1").status == "aborted"


@pytest.mark.slow
def test_a_gateway_killed_mid_turn_leaves_an_error_run_and_every_committed_message(gateway_factory, mock_openai):
    """In-process turns die with their gateway; the next start records the run as failed."""
    env = {
        "OPENCLAW_MODEL_BASE_URL": mock_openai.base_url,
        "OPENCLAW_TASK_MODE": "inprocess",
        "OPENCLAW_MODEL_READ_TIMEOUT_S": "30",
    }
    server = gateway_factory(extra_env=env)
    mock_openai.script(mock.reply("first answer"), mock.slow("never finished because the gateway dies", delay_s=1))

    async def first_half():
        client = operator(server)
        await client.connect()
        key = await _session(client, "crash")
        await client.request("chat.send", {"sessionKey": key, "message": "one", "idempotencyKey": "k1"})
        await client.request("agent.wait", {"runId": "k1", "timeoutMs": 20_000})
        await client.request("chat.send", {"sessionKey": key, "message": "two", "idempotencyKey": "k2"})
        await client.next_event("chat", predicate=lambda f: f["payload"]["runId"] == "k2", timeout=20)
        return key

    key = asyncio.run(first_half())
    server.stop(signal.SIGKILL)
    restarted = start_gateway(extra_env=env, port=server.port)
    try:

        async def second_half():
            client = operator(restarted)
            await client.connect()
            waited = await client.request("agent.wait", {"runId": "k2", "timeoutMs": 20_000})
            history = await client.request("chat.history", {"sessionKey": key})
            await client.close()
            return waited, history

        waited, history = asyncio.run(second_half())
    finally:
        stop_and_remove([restarted])
    assert waited["status"] == "error"
    assert waited["error"] == "run interrupted: the gateway process running it stopped"
    assert _texts(history) == [("user", "one"), ("assistant", "first answer"), ("user", "two")]


@pytest.mark.redis
def test_a_celery_worker_killed_mid_turn_is_failed_when_its_lease_expires(model_gateway, mock_openai):
    mock_openai.script(mock.slow("this reply never finishes because the worker is killed", delay_s=1))

    async def start_turn():
        client = operator(model_gateway)
        await client.connect()
        key = await _session(client, "worker-crash")
        await client.request("chat.send", {"sessionKey": key, "message": "go", "idempotencyKey": "w1"})
        await client.next_event("chat", predicate=lambda f: f["payload"]["runId"] == "w1", timeout=20)
        await client.close()
        return key

    key = asyncio.run(start_turn())
    model_gateway.kill_worker()

    async def wait():
        # No heartbeat silence to wait for (30 s) and no beat: the gateway watches the worker's lease.
        client = operator(model_gateway)
        await client.connect()
        waited = await client.request("agent.wait", {"runId": "w1", "timeoutMs": 30_000}, timeout=35)
        history = await client.request("chat.history", {"sessionKey": key})
        await client.close()
        return waited, history

    waited, history = asyncio.run(wait())
    assert waited["status"] == "error"
    assert waited["error"] == "run interrupted: its worker process stopped (no lease renewal for 5 s)"
    assert _texts(history) == [("user", "go")]


def test_a_non_streaming_reply_is_one_delta_then_final(model_gateway, mock_openai):
    mock_openai.script(mock.echo(stream=False))

    async def scenario():
        client = operator(model_gateway)
        await client.connect()
        key = await _session(client, "plain-json")
        await client.request(
            "chat.send", {"sessionKey": key, "message": "Reply exactly: whole", "idempotencyKey": "n1"}
        )
        waited = await client.request("agent.wait", {"runId": "n1", "timeoutMs": 20_000})
        states = []
        while not client.events.empty():
            frame = client.events.get_nowait()
            if frame["event"] == "chat" and frame["payload"]["runId"] == "n1":
                states.append(frame["payload"]["state"])
        await client.close()
        return waited, states

    waited, states = asyncio.run(scenario())
    assert waited["status"] == "ok" and waited["outputText"] == "whole"
    assert states == ["delta", "final"]


def test_the_stream_goes_to_the_sender_and_to_subscribers_once(gateway):
    async def scenario():
        sender = operator(gateway)
        bystander = operator(gateway)
        subscriber = operator(gateway)
        for client in (sender, bystander, subscriber):
            await client.connect()
        await subscriber.request("sessions.subscribe")
        await sender.request("sessions.subscribe")  # subscribed and the sender: still one copy
        key = await _session(sender, "routed")
        await sender.request("chat.send", {"sessionKey": key, "message": "Reply exactly: x", "idempotencyKey": "rt"})
        await sender.request("agent.wait", {"runId": "rt", "timeoutMs": 20_000})
        await asyncio.sleep(0.3)

        def stream(client):
            return [
                (f["event"], f["payload"]["seq"])
                for f in client.drain_events()
                if f["event"] in ("chat", "agent") and f["payload"].get("runId") == "rt"
            ]

        seen = {
            name: stream(c) for name, c in (("sender", sender), ("bystander", bystander), ("subscriber", subscriber))
        }
        for client in (sender, bystander, subscriber):
            await client.close()
        return seen

    seen = asyncio.run(scenario())
    assert seen["bystander"] == []
    assert seen["sender"] == seen["subscriber"]
    assert len(seen["sender"]) == len(set(seen["sender"])) > 0


def test_agent_wait_never_answers_ahead_of_the_runs_events(gateway):
    """The answer of agent.wait goes out after the run's events on the same connection: for the
    connection that sent the turn and for a subscriber, checked the moment each answer arrives."""

    async def scenario():
        sender, subscriber = operator(gateway), operator(gateway)
        for client in (sender, subscriber):
            await client.connect()
        await subscriber.request("sessions.subscribe")
        key = await _session(sender, "ordered")

        received: dict[int, list[dict]] = {id(sender): [], id(subscriber): []}

        def terminal_seen(client, run_id: str) -> bool:
            received[id(client)] += client.drain_events()
            return any(
                f["event"] == "chat" and f["payload"]["runId"] == run_id and f["payload"]["state"] == "final"
                for f in received[id(client)]
            )

        async def wait_and_look(client, run_id: str) -> tuple[str, bool]:
            waited = await client.request("agent.wait", {"runId": run_id, "timeoutMs": 20_000})
            return waited["status"], terminal_seen(client, run_id)

        outcomes = []
        for i in range(15):
            run_id = f"ord-{i}"
            await sender.request("chat.send", {"sessionKey": key, "message": f"turn {i}", "idempotencyKey": run_id})
            outcomes.append(await asyncio.gather(wait_and_look(sender, run_id), wait_and_look(subscriber, run_id)))
        for client in (sender, subscriber):
            await client.close()
        return outcomes

    outcomes = asyncio.run(scenario())
    assert outcomes == [[("ok", True), ("ok", True)]] * 15
