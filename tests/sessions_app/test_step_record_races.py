"""A step recorded while another writer holds the session: the record waits for it and then decides on what
that writer committed (on PostgreSQL one statement records a step; it must not act on the snapshot it took
before it waited). SQLite serializes writers, so there is nothing to race there."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction

from sessions_app.models import Run, RunStatus, SessionWindow, TranscriptEvent
from sessions_app.services import runs, sessions
from sessions_app.services.transcripts import message_body, transcript_append

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning"),
]

TOOL_RESULT = {"role": "toolResult", "toolCallId": "c1", "toolName": "ls", "content": [{"type": "text", "text": "x"}]}


@pytest.fixture(autouse=True)
def _postgresql_only(monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("row locks and READ COMMITTED snapshots are PostgreSQL's (SQLite serializes writers)")
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: None)


def running_run(key: str) -> Run:
    session = sessions.session_create(spec=sessions.SessionSpec(key=key, agent_id="main"))
    runs.run_submit(session_key=session.key, message="go", idempotency_key=f"{key}:r")
    claimed = runs.run_claim(run_id=f"{key}:r", executor="test")
    assert claimed is not None
    return claimed.run


def wait_until_blocked(thread: threading.Thread) -> None:
    """Until a backend of this database waits for a row lock (the recorder, behind the holder)."""
    deadline = time.monotonic() + 30
    with connections["default"].cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0] > 0:
                return
            assert thread.is_alive(), "the recorder finished without waiting for the session lock"
            time.sleep(0.01)
    raise AssertionError("the recorder never waited for the session lock")


def record_behind(holder) -> list:
    """Record a step while ``holder`` (run inside a transaction holding the session lock) works; the result."""
    outcome: list = []
    recorder = threading.Thread(
        target=lambda: (
            outcome.append(runs.run_record_message(run_id=holder.run_id, body=TOOL_RESULT, message_key="s1.r1")),
            connections.close_all(),
        )
    )
    with transaction.atomic():
        sessions.session_lock(holder.run.session_key)  # the lock every writer of its runs takes first
        recorder.start()
        wait_until_blocked(recorder)
        holder()
    recorder.join(30)
    assert not recorder.is_alive()
    return outcome


class Holder:
    def __init__(self, run: Run, change):
        self.run_id = run.run_id
        self.run = run
        self.change = change

    def __call__(self) -> None:
        self.change(self.run)


def test_a_run_ended_by_the_lock_holder_gets_no_step():
    run = running_run("agent:main:race-end")
    outcome = record_behind(Holder(run, lambda r: Run.objects.filter(run_id=r.run_id).update(status=RunStatus.ABORTED)))
    assert outcome == [None]
    assert not TranscriptEvent.objects.filter(body__role="toolResult").exists()


def test_a_step_after_the_holders_append_chains_onto_it():
    run = running_run("agent:main:race-append")

    def append(r: Run) -> None:
        window = SessionWindow.objects.get(pk=r.window_id)
        transcript_append(session=r.session, window=window, type="message", body=message_body("assistant", "meanwhile"))

    outcome = record_behind(Holder(run, append))
    assert outcome and outcome[0] is not None
    events = list(TranscriptEvent.objects.filter(window_id=run.window_id).order_by("seq"))
    assert [e.body.get("role") for e in events] == ["user", "assistant", "toolResult"]
    assert [e.seq for e in events] == [1, 2, 3]
    assert events[2].parent_id == events[1].event_id
    window = SessionWindow.objects.get(pk=run.window_id)
    assert (window.next_seq, window.leaf_event_id, window.message_count) == (4, events[2].event_id, 3)


def test_a_session_reset_by_the_lock_holder_gets_no_step():
    run = running_run("agent:main:race-reset")

    def reset(r: Run) -> None:
        # What a reset does to the session: a new window becomes current; the old run's window is not.
        window = SessionWindow.objects.get(pk=r.window_id)
        fresh = SessionWindow.objects.create(id=f"{window.id}-next", session_id=window.session_id, reason=window.reason)
        type(r.session).objects.filter(pk=window.session_id).update(session_id=fresh.id)

    outcome = record_behind(Holder(run, reset))
    assert outcome == [None]
    assert not TranscriptEvent.objects.filter(body__role="toolResult").exists()


def test_a_resent_step_is_recorded_once():
    run = running_run("agent:main:resend")
    first = runs.run_record_message(run_id=run.run_id, body=TOOL_RESULT, message_key="s1.r1")
    again = runs.run_record_message(run_id=run.run_id, body=TOOL_RESULT, message_key="s1.r1")
    assert first == again == {**TOOL_RESULT, "runId": run.run_id}
    assert TranscriptEvent.objects.filter(body__role="toolResult").count() == 1
