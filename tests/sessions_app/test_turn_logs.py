"""What a turn leaves in the log: every line it logs names its run and session, a failed turn says why, a turn
failed by recovery too, and an audited action is logged with its reason once it commits (not when it rolls back)."""

from __future__ import annotations

import logging

import pytest
from django.db import transaction

from gateway.audit import Actor, audit
from sessions_app import turns
from sessions_app.model_providers.base import Delta, Finish
from sessions_app.services import runs, sessions

pytestmark = pytest.mark.django_db

provider_logger = logging.getLogger("openclaw.test.provider")


@pytest.fixture(autouse=True)
def _no_dispatch(monkeypatch):
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: None)


class LoggingProvider:
    """A model that logs while it answers (as a real provider logs a retry), then fails or answers."""

    name = "logging"

    def __init__(self, *, fail: bool):
        self.fail = fail

    def stream(self, messages, *, model, should_abort, tools=None):
        provider_logger.info("asking the model")
        if self.fail:
            raise RuntimeError("the model host went away")
        yield Delta(text="hi")
        yield Finish(stop_reason="stop", usage={}, response_id=None, model=model, tool_calls=())


def start_turn(monkeypatch, *, fail: bool, key: str = "agent:main:logs") -> None:
    monkeypatch.setattr(turns, "get_model_provider", lambda: LoggingProvider(fail=fail))
    sessions.session_create(spec=sessions.SessionSpec(key=key, agent_id="main"))
    runs.run_submit(session_key=key, message="hello", idempotency_key="r1")


def test_a_failed_turn_is_logged_with_its_reason_and_every_line_of_it_names_run_and_session(
    monkeypatch, json_log, django_capture_on_commit_callbacks
):
    start_turn(monkeypatch, fail=True)

    with django_capture_on_commit_callbacks(execute=True):
        assert turns.execute_turn("r1") == "error"

    (asked,) = json_log.lines("openclaw.test.provider")
    assert (asked["run_id"], asked["session_key"]) == ("r1", "agent:main:logs")
    (failed,) = [line for line in json_log.lines("sessions_app.services.runs") if line["level"] == "WARNING"]
    assert failed["message"] == "turn r1 failed (unknown): turn failed: RuntimeError: the model host went away"
    assert (failed["run_id"], failed["session_key"]) == ("r1", "agent:main:logs")


def test_a_turn_that_ends_well_logs_no_failure_and_leaves_no_context_behind(
    monkeypatch, json_log, django_capture_on_commit_callbacks
):
    start_turn(monkeypatch, fail=False)

    with django_capture_on_commit_callbacks(execute=True):
        assert turns.execute_turn("r1") == "ok"
    logging.getLogger("openclaw.test.after").info("after the turn")

    assert json_log.lines("sessions_app.services.runs") == []
    (after,) = json_log.lines("openclaw.test.after")
    assert "run_id" not in after and "session_key" not in after


def test_a_turn_failed_by_recovery_is_logged_with_the_reason(monkeypatch, json_log, django_capture_on_commit_callbacks):
    start_turn(monkeypatch, fail=False)
    runs.run_claim(run_id="r1", executor="gateway:gone")

    with django_capture_on_commit_callbacks(execute=True):
        runs.runs_recover(stale_before=None, executors=["gateway:gone"], reason="run interrupted: its worker died")

    (failed,) = json_log.lines("sessions_app.services.runs")
    assert failed["message"] == "turn r1 failed (interrupted): run interrupted: its worker died"
    assert failed["session_key"] == "agent:main:logs"


def test_an_audited_action_is_logged_with_its_reason_once_committed(json_log, django_capture_on_commit_callbacks):
    actor = Actor(label="user:boss")

    with django_capture_on_commit_callbacks(execute=True):
        audit(actor, "placement.fail", "session", "main", {"reason": "Failed by operator", "document": {"big": 1}})
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            audit(actor, "placement.fail", "session", "other", {"reason": "rolled back"})
            transaction.set_rollback(True)

    (line,) = json_log.lines("gateway.audit")
    assert line["message"] == "audit: user:boss placement.fail session:main reason=Failed by operator"
    assert (line["audit_action"], line["actor"]) == ("placement.fail", "user:boss")
