"""sessions_app services: guarded mutations, the transcript, the run state machine, recovery."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone

from gateway.exceptions import Conflict, InvalidRequest, NotFound, Unavailable
from gateway.executor_leases import LEASE_KEY, lease_renew
from sessions_app import selectors, tasks, turns
from sessions_app.model_providers.base import ModelProviderError
from sessions_app.models import Run, Session, SessionWindow, TranscriptEvent
from sessions_app.services import runs, sessions, transcripts

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_dispatch(monkeypatch):
    """Record dispatched turns instead of running them: the tests drive the runner themselves."""
    dispatched: list[str] = []
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: dispatched.append(run_id))
    return dispatched


def make(key: str = "agent:main:s1") -> Session:
    return sessions.session_create(spec=sessions.SessionSpec(key=key, agent_id="main"))


def window(session: Session) -> SessionWindow:
    return SessionWindow.objects.get(pk=session.session_id)


def test_create_makes_the_first_window_and_refuses_a_duplicate_key():
    session = make()
    assert window(session).reason == "initial"
    with pytest.raises(Conflict, match="session already exists: agent:main:s1"):
        make()
    assert Session.objects.count() == 1 and SessionWindow.objects.count() == 1


def test_transcript_appends_are_dense_linked_and_idempotent():
    session = make()
    w = window(session)
    first = transcripts.transcript_append(
        session=session, window=w, type="message", body={"role": "user"}, idempotency_key="k1"
    )
    second = transcripts.transcript_append(
        session=session, window=w, type="message", body={"role": "assistant"}, idempotency_key="k2"
    )
    again = transcripts.transcript_append(
        session=session, window=w, type="message", body={"role": "user", "x": 1}, idempotency_key="k1"
    )
    assert (first.seq, second.seq) == (1, 2)
    assert second.parent_id == first.event_id and first.parent_id == ""
    assert again.pk == first.pk and again.body == {"role": "user"}
    assert TranscriptEvent.objects.count() == 2


def test_guarded_mutations_refuse_a_stale_caller_and_change_nothing():
    session = make()
    fresh = sessions.session_reset(key=session.key)
    for mutate in (
        lambda: sessions.session_patch(key=session.key, changes={"label": "x"}, expected_session_id=session.session_id),
        lambda: sessions.session_reset(key=session.key, expected_lifecycle_revision=session.lifecycle_revision),
        lambda: sessions.session_delete(key=session.key, expected_session_id=session.session_id),
    ):
        with pytest.raises(Conflict, match=r"Session agent:main:s1 changed; retry\."):
            mutate()
    current = Session.objects.get(key=session.key)
    assert (current.session_id, current.lifecycle_revision, current.label) == (
        fresh.session_id,
        fresh.lifecycle_revision,
        "",
    )
    assert sessions.session_patch(key=session.key, changes={"label": "ok"}, expected_session_id=fresh.session_id)


def test_patch_refuses_unknown_fields_and_missing_sessions():
    make()
    with pytest.raises(InvalidRequest, match=r"sessions\.patch cannot change: key"):
        sessions.session_patch(key="agent:main:s1", changes={"key": "other"})
    with pytest.raises(NotFound, match="session not found: agent:main:nope"):
        sessions.session_patch(key="agent:main:nope", changes={"label": "x"})


def test_send_validates_and_is_idempotent():
    session = make()
    for message, error in (
        ("a\x00b", "message must not contain null bytes"),
        (" \t\n", "message or attachment required"),
    ):
        with pytest.raises(InvalidRequest, match=error):
            runs.run_submit(session_key=session.key, message=message, idempotency_key="x")
    first = runs.run_submit(session_key=session.key, message="caf\u0065\u0301\x07", idempotency_key="r")
    again = runs.run_submit(session_key=session.key, message="other text", idempotency_key="r")
    assert first.created and not again.created and again.run.pk == first.run.pk
    assert first.run.message == "café"  # NFC, control character stripped
    other = make("agent:main:s2")
    with pytest.raises(Conflict, match="idempotencyKey already used for another session"):
        runs.run_submit(session_key=other.key, message="hi", idempotency_key="r")
    assert Run.objects.count() == 1


@pytest.mark.parametrize(
    ("message", "cleaned"),
    [
        ("line\n\tcell\r\n", "line\n\tcell\r\n"),  # tab, line feed, carriage return stay
        ("a\x01b\x1fc\x7fd\x0be\x0cf", "abcdef"),
        ("中文\x08字 😀\x1b[0m é", "中文字 😀[0m é"),  # a control byte never hides inside a multi-byte character
        ("e\u0301\x07" * 3, "é" * 3),  # NFC first
        ("\u0080\u009f keep", "\u0080\u009f keep"),  # C1 controls are not stripped (OpenClaw: below 32 and 127)
    ],
)
def test_messages_lose_their_control_characters(message, cleaned):
    assert runs.clean_message(message) == cleaned


def test_a_message_of_control_characters_only_is_empty():
    with pytest.raises(InvalidRequest, match="message or attachment required"):
        runs.clean_message("\x01\x02 \x7f")


def test_a_pending_session_admits_no_turn():
    session = make()
    Session.objects.filter(pk=session.pk).update(initialization_pending=True)
    with pytest.raises(Unavailable, match=r"Session agent:main:s1 is initializing; retry later\."):
        runs.run_submit(session_key=session.key, message="hi", idempotency_key="r")
    assert not Run.objects.exists()


def test_one_turn_at_a_time_per_session_and_the_next_is_dispatched(_no_dispatch):
    session = make()
    runs.run_submit(session_key=session.key, message="one", idempotency_key="r1")
    runs.run_submit(session_key=session.key, message="two", idempotency_key="r2")
    assert _no_dispatch == ["r1", "r2"]
    claim = runs.run_claim(run_id="r1", executor="test")
    assert claim is not None and claim.history == [{"role": "user", "content": "one"}]
    assert runs.run_claim(run_id="r2", executor="test") is None  # session busy
    assert runs.run_claim(run_id="r1", executor="test") is None  # already running
    finished = runs.run_finish(run_id="r1", outcome=runs.TurnOutcome(status="ok", text="ONE"))
    assert finished.status == "ok"
    assert _no_dispatch[-1] == "r2"
    second = runs.run_claim(run_id="r2", executor="test")
    assert second.history == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "ONE"},
        {"role": "user", "content": "two"},
    ]
    # A finish for a run that is no longer running writes nothing.
    assert runs.run_finish(run_id="r1", outcome=runs.TurnOutcome(status="ok", text="again")) is None
    assert TranscriptEvent.objects.count() == 3


def test_a_later_turn_whose_task_arrives_first_waits_for_the_older_one(_no_dispatch):
    """Two workers, a backed-up queue: the task of the third turn is taken before the task the first turn's end
    dispatched for the second. The turns still start in the order they were sent."""
    session = make()
    for run_id in ("r1", "r2", "r3"):
        runs.run_submit(session_key=session.key, message=run_id, idempotency_key=run_id)
    runs.run_claim(run_id="r1", executor="worker-a")
    runs.run_finish(run_id="r1", outcome=runs.TurnOutcome(status="ok", text="R1"))
    assert _no_dispatch[-1] == "r2"

    assert runs.run_claim(run_id="r3", executor="worker-b") is None
    assert Run.objects.get(run_id="r3").status == "queued"
    assert runs.run_claim(run_id="r2", executor="worker-a") is not None
    runs.run_finish(run_id="r2", outcome=runs.TurnOutcome(status="ok", text="R2"))
    assert _no_dispatch[-1] == "r3"
    assert runs.run_claim(run_id="r3", executor="worker-b") is not None
    users = TranscriptEvent.objects.filter(window_id=session.session_id, body__role="user").order_by("seq")
    assert [event.body["content"][0]["text"] for event in users] == ["r1", "r2", "r3"]


def test_turns_sent_in_the_same_instant_start_in_the_order_of_their_ids(_no_dispatch):
    session = make()
    for run_id in ("r-b", "r-a"):
        runs.run_submit(session_key=session.key, message=run_id, idempotency_key=run_id)
    Run.objects.filter(session=session).update(created_at=timezone.now())

    assert runs.run_claim(run_id="r-b", executor="test") is None
    assert runs.run_claim(run_id="r-a", executor="test") is not None


def test_error_turns_write_no_assistant_message():
    session = make()
    runs.run_submit(session_key=session.key, message="one", idempotency_key="r1")
    runs.run_claim(run_id="r1", executor="test")
    run = runs.run_finish(run_id="r1", outcome=runs.TurnOutcome(status="error", error="boom", error_kind="http"))
    assert (run.status, run.error, run.error_kind) == ("error", "boom", "http")
    assert [e.body["role"] for e in TranscriptEvent.objects.order_by("seq")] == ["user"]
    assert Session.objects.get(pk=session.pk).status == "failed"


def test_reset_fails_queued_turns_and_refuses_while_running():
    session = make()
    runs.run_submit(session_key=session.key, message="one", idempotency_key="r1")
    runs.run_submit(session_key=session.key, message="two", idempotency_key="r2")
    runs.run_claim(run_id="r1", executor="test")
    with pytest.raises(Unavailable, match="Reset is unavailable while the agent is working"):
        sessions.session_reset(key=session.key)
    with pytest.raises(Unavailable, match="Delete is unavailable while the agent is working"):
        sessions.session_delete(key=session.key)
    runs.run_finish(run_id="r1", outcome=runs.TurnOutcome(status="ok", text="x"))
    sessions.session_reset(key=session.key)
    assert Run.objects.get(run_id="r2").status == "error"
    assert Run.objects.get(run_id="r2").error == "session was reset before the turn started"


def test_abort_ends_queued_turns_at_once_and_flags_running_ones(monkeypatch):
    flagged: list[str] = []
    monkeypatch.setattr(runs, "request_abort_on_commit", lambda run: flagged.append(run.run_id))
    session = make()
    runs.run_submit(session_key=session.key, message="one", idempotency_key="r1")
    runs.run_submit(session_key=session.key, message="two", idempotency_key="r2")
    runs.run_claim(run_id="r1", executor="test")
    assert runs.run_abort(session_key=session.key) == ["r1", "r2"]
    assert Run.objects.get(run_id="r2").status == "aborted"
    assert Run.objects.get(run_id="r1").status == "running"
    assert flagged == ["r1"]
    with pytest.raises(InvalidRequest, match="runId does not match sessionKey"):
        runs.run_abort(session_key=session.key, run_id="unknown")


def test_recovery_fails_silent_runs_only():
    session = make()
    quiet = make("agent:main:quiet")
    for key, run_id in ((session.key, "alive"), (quiet.key, "dead")):
        runs.run_submit(session_key=key, message="hi", idempotency_key=run_id)
        runs.run_claim(run_id=run_id, executor="celery:host:1")
    runs.run_submit(session_key=quiet.key, message="next", idempotency_key="queued-after-dead")
    Run.objects.filter(run_id="dead").update(heartbeat_at=timezone.now() - timedelta(minutes=5))
    result = tasks.runs_sweep()
    assert result["failed"] == ["dead"]
    dead = Run.objects.get(run_id="dead")
    assert dead.status == "error"
    assert dead.error == "run interrupted: its worker stopped responding (no heartbeat for 30 s)"
    assert Run.objects.get(run_id="alive").status == "running"
    # The dead turn's user message stays in the transcript.
    assert TranscriptEvent.objects.filter(window_id=quiet.session_id).count() == 1


def test_the_turns_of_a_worker_that_stopped_renewing_its_lease_end_and_the_unstarted_ones_go_again(
    _no_dispatch, worker_labels
):
    stopped, alive, never_held = worker_labels("stopped"), worker_labels("alive"), worker_labels("never")
    for label in (stopped, alive):
        lease_renew(label)
    cache.delete(LEASE_KEY.format(stopped))  # expired: the process stopped renewing it
    for key, run_id, executor in (
        ("on-stopped", "r1", stopped),
        ("on-alive", "r2", alive),
        ("never", "r3", never_held),
    ):
        runs.run_submit(session_key=make(f"agent:main:{key}").key, message="hi", idempotency_key=run_id)
        runs.run_claim(run_id=run_id, executor=executor)
    runs.run_submit(session_key="agent:main:on-stopped", message="next", idempotency_key="r1-next")
    # An idle session's queued turns: the first one's task may be what the stopped worker took without starting it.
    idle = make("agent:main:idle")
    for run_id in ("idle-1", "idle-2"):
        runs.run_submit(session_key=idle.key, message=run_id, idempotency_key=run_id)
    _no_dispatch.clear()

    recovered = runs.runs_recover_stopped_workers()
    assert recovered == runs.StoppedWorkersRecovery(failed=["r1"], redispatched=["idle-1"])
    # The idle session's oldest turn (its end dispatches the next), then the failed turn's successor.
    assert _no_dispatch == ["idle-1", "r1-next"]
    failed = Run.objects.get(run_id="r1")
    assert (failed.status, failed.error_kind) == ("error", "interrupted")
    assert failed.error == "run interrupted: its worker process stopped (no lease renewal for 5 s)"
    assert failed.ended_at is not None and Session.objects.get(key="agent:main:on-stopped").status == "failed"
    # A live lease, or none ever held (another version; a turn run by hand): left to the heartbeat silence.
    assert set(Run.objects.filter(status="running").values_list("run_id", flat=True)) == {"r2", "r3"}

    # Handled once: the next watches find nothing to do and dispatch nothing again.
    _no_dispatch.clear()
    assert runs.runs_recover_stopped_workers() == runs.StoppedWorkersRecovery(failed=[], redispatched=[])
    assert _no_dispatch == []


def test_a_stuck_session_gets_only_its_oldest_queued_turn_again(_no_dispatch):
    session = make()
    for run_id in ("r1", "r2"):
        runs.run_submit(session_key=session.key, message=run_id, idempotency_key=run_id)
    _no_dispatch.clear()
    # Both dispatched again would let the second start first on another worker.
    assert runs.runs_redispatch_stuck(queued_before=timezone.now()) == ["r1"]
    assert _no_dispatch == ["r1"]


def test_a_redelivered_task_of_a_started_turn_changes_nothing(settings):
    settings.OPENCLAW_MODEL = {**settings.OPENCLAW_MODEL, "PROVIDER": "echo", "MODEL": "echo"}
    session = make()
    runs.run_submit(session_key=session.key, message="Reply exactly: PONG", idempotency_key="r1")
    runs.run_claim(run_id="r1", executor="celery:killed-host:1")
    before = Run.objects.get(run_id="r1")
    # The killed worker's task, given back by the broker to another worker.
    assert turns.execute_turn("r1") is None
    after = Run.objects.get(run_id="r1")
    assert (after.status, after.executor, after.started_at) == ("running", "celery:killed-host:1", before.started_at)
    assert TranscriptEvent.objects.filter(window_id=session.session_id).count() == 1


def test_runs_of_a_gateway_process_that_is_gone_are_failed_at_start():
    session = make()
    runs.run_submit(session_key=session.key, message="hi", idempotency_key="r1")
    runs.run_claim(run_id="r1", executor="gateway:00000000-0000-0000-0000-000000000000")
    assert runs.runs_recover_dead_gateways() == ["r1"]
    assert Run.objects.get(run_id="r1").error == "run interrupted: the gateway process running it stopped"


def test_execute_turn_with_the_echo_provider(settings):
    settings.OPENCLAW_MODEL = {**settings.OPENCLAW_MODEL, "PROVIDER": "echo", "MODEL": "echo"}
    session = make()
    runs.run_submit(session_key=session.key, message="Reply exactly: PONG", idempotency_key="r1")
    assert turns.execute_turn("r1") == "ok"
    assert turns.execute_turn("r1") is None  # a duplicate task changes nothing
    run = Run.objects.get(run_id="r1")
    assert (run.output_text, run.model_provider, run.model) == ("PONG", "echo", "echo")
    history = selectors.chat_history(Session.objects.get(pk=session.pk))
    assert [m["content"][0]["text"] for m in history["messages"]] == ["Reply exactly: PONG", "PONG"]


class _FailingProvider:
    name = "failing"

    def __init__(self, error: Exception):
        self.error = error

    def stream(self, messages, *, model, should_abort, tools=None):
        raise self.error
        yield  # pragma: no cover - makes this a generator


@pytest.mark.parametrize(
    ("error", "message", "kind"),
    [
        (
            ModelProviderError("model provider returned HTTP 500: nope", kind="http"),
            "model provider returned HTTP 500: nope",
            "http",
        ),
        (RuntimeError("bug"), "turn failed: RuntimeError: bug", "unknown"),
    ],
)
def test_execute_turn_records_provider_failures(monkeypatch, error, message, kind):
    monkeypatch.setattr(turns, "get_model_provider", lambda: _FailingProvider(error))
    session = make()
    runs.run_submit(session_key=session.key, message="hi", idempotency_key="r1")
    assert turns.execute_turn("r1") == "error"
    run = Run.objects.get(run_id="r1")
    assert (run.error, run.error_kind) == (message, kind)
    assert TranscriptEvent.objects.filter(type="message", body__role="assistant").count() == 0


def test_listing_a_page_costs_the_same_few_queries_whatever_the_table_size(django_assert_max_num_queries):
    for index in range(150):
        make(f"agent:main:bulk-{index}")
    with django_assert_max_num_queries(1):
        page, has_more = selectors.sessions_page(limit=100, offset=0)
    assert len(page) == 100 and has_more
    with django_assert_max_num_queries(1):
        page, has_more = selectors.sessions_page(limit=100, offset=100)
    assert len(page) == 50 and not has_more


def test_claim_and_finish_cost_few_statements_and_return_what_was_stored(django_assert_num_queries):
    """A turn's claim and finish run in the worker between send and wait: each statement is a round
    trip on the turn's critical path (the session lock first, then every read once)."""
    session = make()
    runs.run_submit(session_key=session.key, message="one", idempotency_key="r1")
    # Savepoint and release around each (the test's transaction), lock, run with its window, running
    # check, insert (no idempotency lookup: the run's state proves the first time), window update,
    # claim, session update, history.
    with django_assert_num_queries(10):
        claim = runs.run_claim(run_id="r1", executor="test")
    stored = Run.objects.get(pk="r1")
    assert (claim.run.status, claim.run.user_event_id, claim.run.started_at) == (
        stored.status,
        stored.user_event_id,
        stored.started_at,
    )
    assert stored.user_event_id
    usage = {"input": 1, "output": 1, "totalTokens": 2}
    outcome = runs.TurnOutcome(status="ok", text="ONE", stop_reason="stop", usage=usage, model="echo")
    # The same up to the finish, then session update and next-run lookup.
    with django_assert_num_queries(9):
        finished = runs.run_finish(run_id="r1", outcome=outcome)
    stored = Run.objects.get(pk="r1")
    for field in ("status", "output_text", "assistant_event_id", "ended_at", "usage", "model", "stop_reason"):
        assert getattr(finished, field) == getattr(stored, field), field
    assert stored.assistant_event_id and stored.status == "ok"


def test_a_repeated_claim_or_finish_appends_nothing_twice():
    """Without the idempotency lookup, the run's state is the guard: a second claim or finish of
    the same run finds it no longer queued or running, and writes nothing."""
    session = make()
    runs.run_submit(session_key=session.key, message="one", idempotency_key="r1")
    assert runs.run_claim(run_id="r1", executor="test") is not None
    assert runs.run_claim(run_id="r1", executor="test") is None
    outcome = runs.TurnOutcome(status="ok", text="ONE")
    assert runs.run_finish(run_id="r1", outcome=outcome) is not None
    assert runs.run_finish(run_id="r1", outcome=outcome) is None
    bodies = [(e.body["role"], e.idempotency_key) for e in TranscriptEvent.objects.order_by("seq")]
    assert bodies == [("user", "r1:user"), ("assistant", "r1:assistant")]


def test_claim_and_finish_of_an_unknown_run_change_nothing():
    assert runs.run_claim(run_id="missing", executor="test") is None
    assert runs.run_finish(run_id="missing", outcome=runs.TurnOutcome(status="ok", text="x")) is None
    assert not TranscriptEvent.objects.exists()


def test_a_steps_nul_characters_and_odd_shapes_are_stored_not_refused():
    """PostgreSQL stores no NUL in jsonb or text: a tool's output (``printf 'a\\0b'``) or a node's message with one
    is stored with U+FFFD instead. ``details`` and ``content`` of other shapes do not break the artifact's note."""
    session = make()
    runs.run_submit(session_key=session.key, message="go", idempotency_key="r1")
    runs.run_claim(run_id="r1", executor="test")
    body = {
        "role": "toolResult", "toolCallId": "c\x001", "toolName": "exec", "isError": False,
        "content": [{"type": "text", "text": "a\x00b"}], "details": "not a dict", "k\x00ey": ["x\x00"],
    }  # fmt: skip

    stored = runs.run_record_message(run_id="r1", body=body, message_key="s1.r1", full_text="whole a\x00b output")
    plain = runs.run_record_message(run_id="r1", body={**body, "details": {}}, message_key="s1.r2")

    assert stored["content"][0]["text"] == plain["content"][0]["text"] == "a\ufffdb"
    assert stored["details"]["artifactId"] and plain["toolCallId"] == "c\ufffd1" and plain["k\ufffdey"] == ["x\ufffd"]
    assert runs.ToolArtifact.objects.get(run_id="r1").content == "whole a\ufffdb output"
    events = TranscriptEvent.objects.filter(window_id=session.session_id, body__role="toolResult")
    assert [event.body["content"][0]["text"] for event in events.order_by("seq")] == ["a\ufffdb", "a\ufffdb"]


def test_a_turns_end_keeps_only_bounded_usage_and_text_without_nul():
    session = make()
    runs.run_submit(session_key=session.key, message="go", idempotency_key="r1")
    runs.run_claim(run_id="r1", executor="test")
    usage = {"input": "12", "output": 10**30, "cacheRead": -5, "totalTokens": 7, "cost": {"total": 0.25, "x": "y"},
             "flag": True, "nan": float("nan")}  # fmt: skip

    finished = runs.run_finish(run_id="r1", outcome=runs.TurnOutcome(status="ok", text="do\x00ne", usage=usage))

    assert finished.usage == {"totalTokens": 7, "cost": {"total": 0.25}}
    assert finished.output_text == "do\ufffdne"
    stored = Session.objects.get(pk=session.pk)
    assert (stored.input_tokens, stored.output_tokens) == (0, 0)
    reply = TranscriptEvent.objects.get(window_id=session.session_id, body__role="assistant").body
    assert reply["content"][0]["text"] == "do\ufffdne" and reply["usage"] == {"totalTokens": 7, "cost": {"total": 0.25}}
