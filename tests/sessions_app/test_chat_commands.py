"""Commands typed into chat.send (sessions_app/commands.py, services/commands.py): each one answered by the gateway
in one transaction, recorded as a run that ends as it starts, its reply the run's one ``chat`` event; the model is
never asked (the real mock OpenAI server's request log stays empty) and never sees them afterwards."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.core.cache import cache

from gateway import scopes as sc
from gateway.exceptions import Conflict, InvalidRequest, Unavailable
from sessions_app import commands, rpc, schemas, selectors, turns
from sessions_app.models import Run, RunStatus, Session, SessionWindow, TranscriptEvent
from sessions_app.services import commands as chat_commands
from sessions_app.services import runs, sessions
from tests.support.mock_openai import MockOpenAI

pytestmark = pytest.mark.django_db

KEY = "agent:main:cmd"
ADMIN = (sc.ADMIN,)
WRITER = (sc.READ, sc.WRITE)


@pytest.fixture
def mock_model(settings) -> Iterator[MockOpenAI]:
    """The gateway's provider is the real mock OpenAI server: any model call shows in its request log."""
    with MockOpenAI().start() as server:
        settings.OPENCLAW_MODEL = {
            **settings.OPENCLAW_MODEL,
            "PROVIDER": "openai",
            "BASE_URL": server.base_url,
            "API_KEY": "",
            "MODEL": "mock-model",
            "READ_TIMEOUT_S": 5.0,
        }
        yield server


@pytest.fixture
def dispatched(monkeypatch) -> list[str]:
    """Turns handed to a runner (the tests run the ones they need themselves)."""
    handed: list[str] = []
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: handed.append(run_id))
    return handed


@pytest.fixture
def session(mock_model, dispatched) -> Session:
    return sessions.session_create(spec=sessions.SessionSpec(key=KEY, agent_id="main"))


def send(message: str, key: str, *, scopes=ADMIN, origin: str = "", session_key: str = KEY, **extra):
    return chat_commands.chat_submit(
        session_key=session_key, message=message, idempotency_key=key, origin_channel=origin, scopes=scopes, **extra
    )


def transcript(session_id: str) -> list[dict]:
    return [e.body for e in TranscriptEvent.objects.filter(window_id=session_id).order_by("seq")]


def texts(session_id: str) -> list[tuple[str, str]]:
    return [(b["role"], b["content"][0]["text"]) for b in transcript(session_id)]


def reply_of(run_id: str) -> str:
    run = Run.objects.get(run_id=run_id)
    assert (run.status, run.stop_reason) == (RunStatus.OK, "stop")
    return run.output_text


def current(key: str = KEY) -> Session:
    return Session.objects.get(key=key)


# --- the table --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "name", "args"),
    [
        ("/status", "status", ""),
        ("  /STATUS \n", "status", ""),
        ("/status plugins", "status", "plugins"),
        ("/help", "help", ""),
        ("/Help:", "help", ""),
        ("/new", "new", ""),
        ("/NEW hello\nthere ", "new", "hello\nthere"),
        ("/reset: start over", "reset", "start over"),
        ("/model", "model", ""),
        ("/model:openai/gpt-x", "model", "openai/gpt-x"),
    ],
)
def test_a_message_that_is_a_command_is_recognized_with_its_arguments(message, name, args):
    parsed = commands.parse_command(message)
    assert parsed is not None
    assert (parsed.command.name, parsed.args) == (name, args)


@pytest.mark.parametrize(
    "message",
    ["/foo bar", "/statusx", "/new-thing", "hello /status", "/", "/help me", "/ status", "status", "//status"],
)
def test_anything_else_is_a_message_for_the_model(message):
    assert commands.parse_command(message) is None


def test_the_command_descriptors_list_every_command_once_in_openclaws_shape():
    described = commands.gateway_commands()
    assert [c["name"] for c in described] == ["help", "status", "new", "reset", "model"]
    model = next(c for c in described if c["name"] == "model")
    assert model["textAliases"] == ["/model"] and model["acceptsArgs"] is True
    assert model["args"] == [
        {
            "name": "model",
            "description": "provider/model, a model id of the configured provider, or default",
            "type": "string",
        }
    ]
    helped = next(c for c in described if c["name"] == "help")
    assert helped["acceptsArgs"] is False and "args" not in helped
    assert all(c["source"] == "native" and c["scope"] == "text" for c in described)


# --- /status and /help ------------------------------------------------------------------------------------------


def test_status_is_answered_by_the_gateway_recorded_as_a_run_and_kept_out_of_the_models_context(
    session, mock_model, dispatched
):
    submitted = send("/status", "s1", scopes=WRITER)

    assert submitted.created and submitted.run.run_id == "s1"
    assert selectors.chat_send_payload(submitted.run, created=True) == {"runId": "s1", "status": "started"}
    reply = reply_of("s1")
    assert "🧠 Model: openai/mock-model (configured default)" in reply
    assert "🧮 Tokens: 0 in / 0 out" in reply
    assert f"🧵 Session: {KEY} · id {session.session_id}" in reply
    assert "⚙️ Execution: on this gateway (not placed on a worker)" in reply
    assert "🪢 Turns: idle" in reply
    assert texts(session.session_id) == [("user", "/status"), ("assistant", reply)]
    asked, answered = transcript(session.session_id)
    assert asked["excludeFromContext"] is True and answered["excludeFromContext"] is True
    assert (answered["provider"], answered["model"], answered["runId"]) == ("openclaw", "gateway-injected", "s1")
    assert current().last_run_id == "s1"
    assert dispatched == [] and mock_model.requests == []

    # The next turn's model context has the conversation without the command and its reply.
    turn = send("Reply exactly: PONG", "t1")
    assert dispatched == ["t1"]
    assert turns.execute_turn(turn.run.run_id) == RunStatus.OK
    assert mock_model.requests[-1]["messages"] == [{"role": "user", "content": "Reply exactly: PONG"}]


def test_status_reports_the_running_turn_the_queue_and_the_tokens(session):
    Session.objects.filter(pk=session.pk).update(input_tokens=1200, output_tokens=34)
    send("first", "t1")
    send("second", "t2")
    runs.run_claim(run_id="t1", executor="test")

    reply = reply_of(send("/status", "s1").run.run_id)
    assert "🧮 Tokens: 1200 in / 34 out" in reply
    assert "🪢 Turns: a turn is running, 1 queued" in reply
    assert "📚 Transcript: 1 message" in reply  # the running turn's user message


def test_help_lists_the_commands_of_the_table(session, mock_model):
    reply = reply_of(send("/help", "h1", scopes=WRITER).run.run_id)
    for command in commands.GATEWAY_COMMANDS:
        assert command.usage in reply
    assert mock_model.requests == []


def test_the_reply_is_the_runs_one_chat_event_sent_to_the_sender_after_commit(
    session, django_capture_on_commit_callbacks
):
    layer = get_channel_layer()
    origin = async_to_sync(layer.new_channel)()
    with django_capture_on_commit_callbacks(execute=True):
        send("/help", "h1", origin=origin)

    async def receive() -> dict:
        return await asyncio.wait_for(layer.receive(origin), 5)

    message = async_to_sync(receive)()
    assert (message["event"], message["direct"]) == ("chat", True)
    payload = message["payload"]
    assert {k: payload[k] for k in ("runId", "sessionKey", "seq", "state", "stopReason")} == {
        "runId": "h1",
        "sessionKey": KEY,
        "seq": 1,
        "state": "final",
        "stopReason": "stop",
    }
    assert payload["message"] == transcript(current().session_id)[-1]
    # agent.wait's answer rides on it (the run ended ok with the reply as its output).
    assert message["followUp"]["result"]["status"] == "ok"
    assert message["followUp"]["result"]["outputText"] == commands.help_text()


# --- /model ------------------------------------------------------------------------------------------------------


def test_model_shows_the_current_model_and_sets_this_sessions_model_the_way_sessions_patch_does(session, mock_model):
    shown = reply_of(send("/model", "m1", scopes=WRITER).run.run_id)
    assert shown.startswith("Current: openai/mock-model\nDefault: openai/mock-model\n")

    assert reply_of(send("/model openai/gpt-big", "m2", scopes=WRITER).run.run_id) == (
        "Model set to openai/gpt-big for this session only; configured default unchanged."
    )
    assert current().model == "gpt-big"
    assert reply_of(send("/model gpt-small -s", "m3", scopes=WRITER).run.run_id).startswith(
        "Model set to openai/gpt-small"
    )
    assert current().model == "gpt-small"
    assert rpc.sessions_describe_rpc(None, schemas.SessionsDescribeParams(key=KEY))["session"]["model"] == "gpt-small"

    assert reply_of(send("/model default", "m4", scopes=WRITER).run.run_id) == (
        "Session model reset to configured default (openai/mock-model)."
    )
    assert current().model == ""
    assert mock_model.requests == []


def test_the_switched_model_is_the_one_the_next_turn_asks_for(session, mock_model):
    send("/model openai/gpt-big", "m1")
    turn = send("hello", "t1")
    assert turns.execute_turn(turn.run.run_id) == RunStatus.OK
    assert [r["model"] for r in mock_model.requests] == ["gpt-big"]


@pytest.mark.parametrize(
    ("message", "reply"),
    [
        ("/model other/gpt-x", '⚠️ Unknown provider "other". This gateway\'s models come from provider "openai".'),
        ("/model gpt-a gpt-b", commands.MODEL_USAGE),
        ("/model gpt-a --fast", commands.MODEL_USAGE),
        ("/model openai/", commands.MODEL_USAGE),
        ("/model " + "x" * 201, commands.MODEL_USAGE),
        ("/model gpt-a -g", commands.MODEL_DEFAULTS_REFUSED),
        ("/model gpt-a --agent", commands.MODEL_DEFAULTS_REFUSED),
    ],
)
def test_a_model_the_gateway_cannot_use_is_refused_in_the_reply_and_nothing_changes(
    session, mock_model, message, reply
):
    sessions.session_patch(key=KEY, changes={"model": "kept"})
    assert reply_of(send(message, "m1").run.run_id) == reply
    assert current().model == "kept"
    assert mock_model.requests == []


# --- /new and /reset ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("command", "done"), [("/new", commands.NEW_DONE), ("/reset", commands.RESET_DONE)])
def test_new_and_reset_start_a_fresh_transcript_and_keep_the_old_one(session, mock_model, dispatched, command, done):
    send("hello", "t1")
    turns.execute_turn("t1")
    before = current()

    submitted = send(command, "r1")

    after = current()
    assert after.session_id != before.session_id and after.lifecycle_revision != before.lifecycle_revision
    fresh = SessionWindow.objects.get(pk=after.session_id)
    assert (fresh.reason, fresh.previous_session_id) == ("reset", before.session_id)
    assert texts(before.session_id) == [("user", "hello"), ("assistant", "hello")]  # the old transcript stays
    assert texts(after.session_id) == [("user", command), ("assistant", done)]
    assert submitted.run.window_id == after.session_id and reply_of("r1") == done
    assert dispatched == ["t1"] and len(mock_model.requests) == 1


def test_reset_with_text_starts_the_fresh_transcript_with_that_text_as_a_turn(session, mock_model, dispatched):
    send("old news", "t1")
    turns.execute_turn("t1")

    submitted = send("/reset Reply exactly: FRESH", "r1")

    assert dispatched == ["t1", "r1"]
    run = submitted.run
    assert (run.status, run.message, run.window_id) == (RunStatus.QUEUED, "Reply exactly: FRESH", current().session_id)
    assert turns.execute_turn("r1") == RunStatus.OK
    assert mock_model.requests[-1]["messages"] == [{"role": "user", "content": "Reply exactly: FRESH"}]
    assert texts(current().session_id) == [("user", "Reply exactly: FRESH"), ("assistant", "FRESH")]


@pytest.mark.parametrize("command", ["/new", "/reset", "/new hello"])
def test_a_reset_without_operator_admin_is_refused_in_the_reply_and_nothing_changes(session, dispatched, command):
    before = current()
    assert reply_of(send(command, "r1", scopes=WRITER).run.run_id) == commands.RESET_REFUSED
    after = current()
    assert (after.session_id, after.lifecycle_revision) == (before.session_id, before.lifecycle_revision)
    assert SessionWindow.objects.filter(session=session).count() == 1
    assert texts(after.session_id) == [("user", command), ("assistant", commands.RESET_REFUSED)]
    assert dispatched == []


def test_reset_during_a_turn_ends_that_turn_aborted_and_its_runner_records_nothing_more(
    session, django_capture_on_commit_callbacks
):
    send("a long one", "t1")
    claimed = runs.run_claim(run_id="t1", executor="test")
    send("waiting", "t2")

    with django_capture_on_commit_callbacks(execute=True):
        send("/reset", "r1")

    stopped = Run.objects.get(run_id="t1")
    assert (stopped.status, stopped.stop_reason) == (RunStatus.ABORTED, "aborted")
    assert runs.abort_requested(stopped)  # its runner is told to stop, as by chat.abort
    assert Run.objects.get(run_id="t2").status == RunStatus.ERROR  # queued turns fail, as with sessions.reset
    assert reply_of("r1") == commands.RESET_DONE
    assert current().session_id != claimed.run.window_id
    # What the runner still tries to write is refused: the turn is no longer its to record.
    late = runs.TurnOutcome(status=RunStatus.OK, text="too late")
    assert runs.run_finish(run_id="t1", outcome=late) is None
    assert runs.run_record_message(run_id="t1", body={"role": "assistant"}, message_key="s0") is None
    assert texts(claimed.run.window_id) == [("user", "a long one")]
    cache.delete(runs.abort_key(stopped))


# --- idempotency and refusals ------------------------------------------------------------------------------------


def test_a_repeated_send_of_a_command_is_the_same_run_and_does_nothing_again(session):
    first = send("/new", "r1")
    renewed = current().session_id
    again = send("/new", "r1")
    assert (again.created, again.run.run_id) == (False, "r1")
    assert selectors.chat_send_payload(again.run, created=False) == {"runId": "r1", "status": "ok"}
    assert current().session_id == renewed and first.created
    assert SessionWindow.objects.filter(session=session).count() == 2
    assert Run.objects.count() == 1

    sessions.session_create(spec=sessions.SessionSpec(key="agent:main:other", agent_id="main"))
    with pytest.raises(Conflict, match="idempotencyKey already used for another session"):
        send("/status", "r1", session_key="agent:main:other")


def test_a_command_the_send_refuses_writes_nothing(session):
    with pytest.raises(InvalidRequest, match="message must not contain null bytes"):
        send("/status\x00", "s1")
    with pytest.raises(InvalidRequest, match=f"sessionId does not match the current session of {KEY}"):
        send("/status", "s2", expected_session_id="stale")
    Session.objects.filter(pk=session.pk).update(initialization_pending=True)
    with pytest.raises(Unavailable, match=f"Session {KEY} is initializing; retry later."):
        send("/reset", "s3")
    assert not Run.objects.exists() and not TranscriptEvent.objects.exists()
    assert current().session_id == session.session_id


def test_an_unknown_slash_command_is_an_ordinary_turn_for_the_model(session, mock_model, dispatched):
    submitted = send("/foo bar", "t1")
    assert (submitted.run.status, dispatched) == (RunStatus.QUEUED, ["t1"])
    assert turns.execute_turn("t1") == RunStatus.OK
    assert mock_model.requests[-1]["messages"] == [{"role": "user", "content": "/foo bar"}]


def test_the_main_session_is_created_for_a_command_as_for_a_turn(mock_model, dispatched):
    send("/status", "s1", session_key="agent:main:main")
    assert "🧵 Session: agent:main:main" in reply_of("s1")
