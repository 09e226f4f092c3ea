"""The seams other apps fill (turn runners, session projections, action guards), through the real
RPC handlers, JSON API and services: what a contributor adds shows up, what a guard refuses changes
nothing, and a runner chosen for a session receives exactly that session's turns."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from django.db import connection
from django.test import Client

from gateway.exceptions import Unavailable
from sessions_app import rpc, schemas, selectors
from sessions_app.extensions import SessionAction, action_guards, session_projections, turn_runners
from sessions_app.models import Run, Session, SessionWindow, TranscriptEvent
from sessions_app.runners import GatewayTurnRunner
from sessions_app.services import forks, runs, sessions
from tests.support.api import API_TOKEN

pytestmark = pytest.mark.django_db


class RecordingRunner:
    name = "recording"

    def __init__(self) -> None:
        self.dispatched: list[str] = []

    def dispatch(self, run_id: str) -> None:
        self.dispatched.append(run_id)


def make(key: str) -> Session:
    return sessions.session_create(spec=sessions.SessionSpec(key=key, agent_id="main"))


def send(key: str, run_id: str) -> dict:
    return rpc.chat_send_rpc(_ctx(), schemas.ChatSendParams(sessionKey=key, message="hi", idempotencyKey=run_id))


def _ctx():
    class Ctx:
        channel_name = ""

    return Ctx()


# --- turn runners -------------------------------------------------------------------------------


def test_the_gateway_runner_is_the_default():
    assert isinstance(turn_runners.for_session(make("agent:main:plain")), GatewayTurnRunner)


def test_a_selected_runner_receives_its_sessions_turns_after_commit(django_capture_on_commit_callbacks, monkeypatch):
    placed, local = make("agent:main:placed"), make("agent:main:local")
    worker = RecordingRunner()
    gateway_dispatched: list[str] = []
    monkeypatch.setattr(GatewayTurnRunner, "dispatch", lambda self, run_id: gateway_dispatched.append(run_id))

    with turn_runners.selecting(lambda session: worker if session.key == placed.key else None):
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            send(placed.key, "r-placed")
            send(local.key, "r-local")
        # Nothing is dispatched before the run's row commits.
        assert worker.dispatched == [] and gateway_dispatched == []
        for callback in callbacks:
            callback()

    assert worker.dispatched == ["r-placed"]
    assert gateway_dispatched == ["r-local"]


def test_the_next_queued_turn_goes_to_the_same_runner(django_capture_on_commit_callbacks):
    session = make("agent:main:placed")
    worker = RecordingRunner()
    with turn_runners.selecting(lambda s: worker), django_capture_on_commit_callbacks(execute=True):
        send(session.key, "r1")
        send(session.key, "r2")
        runs.run_claim(run_id="r1", executor="test")
        runs.run_finish(run_id="r1", outcome=runs.TurnOutcome(status="ok", text="done"))

    assert worker.dispatched == ["r1", "r2", "r2"]  # r2 at submit, and again when r1 ended


# --- session projections --------------------------------------------------------------------------


def test_contributed_fields_appear_in_describe_list_and_the_api(api_token, django_assert_num_queries):
    for n in range(3):
        make(f"agent:main:s{n}")
    calls: list[list[str]] = []

    def residence(batch: Sequence[Session]) -> dict[str, dict]:
        calls.append([s.key for s in batch])
        return {s.key: {"residence": {"host": "gateway", "slot": 0}} for s in batch if s.key != "agent:main:s1"}

    with session_projections.contributing("residence", residence):
        described = rpc.sessions_describe_rpc(_ctx(), schemas.SessionRef(key="agent:main:s0"))
        # The page, with workers_app's placements joined in; the contributor here reads nothing.
        with django_assert_num_queries(1):
            listed = rpc.sessions_list_rpc(_ctx(), schemas.SessionsListParams())
        api = Client(headers={"Authorization": f"Bearer {API_TOKEN}"}).get("/api/sessions/agent:main:s2")

    assert described["session"]["residence"] == {"host": "gateway", "slot": 0}
    rows = {row["key"]: row for row in listed["sessions"]}
    assert "residence" not in rows["agent:main:s1"]
    assert rows["agent:main:s0"]["residence"]["host"] == "gateway"
    assert api.json()["session"]["residence"] == {"host": "gateway", "slot": 0}
    # One call per page, not one per row.
    assert sorted(calls[1]) == ["agent:main:s0", "agent:main:s1", "agent:main:s2"]
    # Gone with the contributor.
    assert "residence" not in rpc.sessions_describe_rpc(_ctx(), schemas.SessionRef(key="agent:main:s0"))["session"]


def test_a_related_relation_is_trusted_only_from_the_query_that_read_the_session():
    # workers_app's placement projection reads Session.placement ("related"): the sessions selectors
    # join it in; a session held in memory is not trusted with it.
    assert "placement" in session_projections.related()
    make("agent:main:s0")
    seen: list[bool] = []

    def recorder(batch: Sequence[Session]) -> dict[str, dict]:
        seen.extend(session_projections.related_loaded(s, "placement") for s in batch)
        return {}

    with session_projections.contributing("recorder", recorder):
        rpc.sessions_describe_rpc(_ctx(), schemas.SessionRef(key="agent:main:s0"))
        rpc.sessions_list_rpc(_ctx(), schemas.SessionsListParams())
        selectors.session_row(Session.objects.get(key="agent:main:s0"))
    assert seen == [True, True, False]


def test_a_page_reads_only_the_related_columns_its_contributors_declared(django_assert_num_queries):
    # workers_app declares the placement columns its projection reads; the page leaves the others out.
    unread = set(session_projections.unread_columns())
    assert "placement__turn_claim_id" in unread and "placement__state" not in unread
    make("agent:main:s0")
    statements: list[str] = []

    def capture(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        rpc.sessions_list_rpc(_ctx(), schemas.SessionsListParams())
        described = rpc.sessions_describe_rpc(_ctx(), schemas.SessionRef(key="agent:main:s0"))
    assert len(statements) == 2  # one query each
    for sql in statements:
        assert '"turn_claim_id"' not in sql and '"generation"' in sql and '"plugin_extensions"' not in sql
    assert described["session"]["key"] == "agent:main:s0"
    assert rpc.sessions_describe_rpc(_ctx(), schemas.SessionRef(key="agent:main:none")) == {"session": None}

    # A contributor that reads the same relation without declaring its columns gets all of them again.
    with session_projections.contributing("claims", lambda batch: {}, related=("placement",)):
        assert not any(path.startswith("placement__") for path in session_projections.unread_columns())
        with connection.execute_wrapper(capture):
            rpc.sessions_list_rpc(_ctx(), schemas.SessionsListParams())
        assert '"turn_claim_id"' in statements[-1]
    assert set(session_projections.unread_columns()) == unread


@pytest.mark.parametrize(
    ("related", "columns", "message"),
    [
        ((), ("placement__state",), "not of a related relation"),
        (("placement",), ("placement__no_such_column",), "names no column"),
        (("placement",), ("state",), "not of a related relation"),
    ],
)
def test_a_declared_column_must_name_a_column_of_a_related_relation(related, columns, message):
    with pytest.raises(ValueError, match=message):
        session_projections.register("wrong", lambda batch: {}, related=related, columns=columns)
    # Nothing was registered: the name is free and the page's columns are unchanged.
    with session_projections.contributing("wrong", lambda batch: {}):
        pass


def test_a_projection_may_not_override_session_fields():
    make("agent:main:s0")
    with session_projections.contributing("bad", lambda batch: {s.key: {"status": "hijacked"} for s in batch}):
        with pytest.raises(RuntimeError, match=r"overrides session fields \['status'\]"):
            rpc.sessions_describe_rpc(_ctx(), schemas.SessionRef(key="agent:main:s0"))


def test_two_contributors_may_not_claim_the_same_field():
    make("agent:main:s0")
    with (
        session_projections.contributing("a", lambda batch: {s.key: {"residence": 1} for s in batch}),
        session_projections.contributing("b", lambda batch: {s.key: {"residence": 2} for s in batch}),
        pytest.raises(RuntimeError, match=r"session projection b repeats fields \['residence'\]"),
    ):
        rpc.sessions_describe_rpc(_ctx(), schemas.SessionRef(key="agent:main:s0"))


def test_a_projection_name_is_registered_once():
    with session_projections.contributing("residence", lambda batch: {}):
        with pytest.raises(RuntimeError, match="registered twice: residence"):
            session_projections.register("residence", lambda batch: {})


# --- action guards ---------------------------------------------------------------------------------


def refuse(action: SessionAction, message: str):
    def guard(session: Session, attempted: SessionAction) -> None:
        if attempted == action:
            raise Unavailable(message, retryable=True)

    return guard


def test_a_refused_turn_changes_nothing():
    session = make("agent:main:moving")
    before = Session.objects.get(pk=session.pk)
    with action_guards.guarding(refuse(SessionAction.SEND, "session placement is mid-dispatch")):
        with pytest.raises(Unavailable, match="session placement is mid-dispatch"):
            send(session.key, "r1")
    assert not Run.objects.exists()
    after = Session.objects.get(pk=session.pk)
    assert (after.last_run_id, after.last_interaction_at, after.updated_at) == (
        before.last_run_id,
        before.last_interaction_at,
        before.updated_at,
    )
    # Without the guard the same send is admitted.
    assert send(session.key, "r1") == {"runId": "r1", "status": "started"}


def test_refused_reset_and_delete_change_nothing():
    session = make("agent:main:moving")
    with action_guards.guarding(refuse(SessionAction.RESET, "no reset while moving")):
        with pytest.raises(Unavailable, match="no reset while moving"):
            sessions.session_reset(key=session.key)
    with action_guards.guarding(refuse(SessionAction.DELETE, "no delete while moving")):
        with pytest.raises(Unavailable, match="no delete while moving"):
            sessions.session_delete(key=session.key)
    current = Session.objects.get(key=session.key)
    assert (current.session_id, current.lifecycle_revision) == (session.session_id, session.lifecycle_revision)
    assert SessionWindow.objects.filter(session=current).count() == 1


def test_a_refused_fork_source_creates_no_child():
    source = make("agent:main:source")
    runs.run_submit(session_key=source.key, message="first", idempotency_key="r1")
    runs.run_claim(run_id="r1", executor="test")
    runs.run_finish(run_id="r1", outcome=runs.TurnOutcome(status="ok", text="reply"))
    entry = TranscriptEvent.objects.filter(window_id=source.session_id, body__role="user").get()
    with action_guards.guarding(refuse(SessionAction.FORK, "no fork while moving")):
        with pytest.raises(Unavailable, match="no fork while moving"):
            forks.session_fork(session_key=source.key, entry_id=entry.event_id)
    assert Session.objects.count() == 1
    assert forks.session_fork(session_key=source.key, entry_id=entry.event_id)["editorText"] == "first"
