"""The placement port (``sessions_app.ports``), through the real RPC handlers, JSON API and services: what the
port's runner gets, the fields it adds, what it refuses. A test port stands in for workers_app's here (that
one is tested in tests/workers_app); the port is replaced for the test and given back after it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from django.test import Client

from gateway import background
from gateway.exceptions import Unavailable
from sessions_app import ports, rpc, schemas
from sessions_app.models import Run, Session, SessionWindow, TranscriptEvent
from sessions_app.ports import SessionAction
from sessions_app.services import forks, runs, sessions
from tests.support.api import API_TOKEN

pytestmark = pytest.mark.django_db


class RecordingRunner:
    name = "recording"

    def __init__(self) -> None:
        self.dispatched: list[str] = []

    def dispatch(self, run_id: str) -> None:
        self.dispatched.append(run_id)


class TestPort:
    """A placement port whose parts each test sets."""

    __test__ = False

    def __init__(self) -> None:
        self.runner: Callable[[Session], Any] = lambda session: None
        self.fields: Callable[[Sequence[Session]], dict] = lambda sessions: {}
        self.refuse: tuple[SessionAction, str] | None = None

    def runner_for(self, session: Session):
        return self.runner(session)

    def session_fields(self, sessions: Sequence[Session]) -> dict:
        return self.fields(sessions)

    def check_action(self, session: Session, action: SessionAction) -> None:
        if self.refuse is not None and self.refuse[0] == action:
            raise Unavailable(self.refuse[1], retryable=True)


@pytest.fixture
def port(monkeypatch) -> TestPort:
    test_port = TestPort()
    monkeypatch.setattr(ports, "_placements", test_port)
    return test_port


@pytest.fixture
def gateway_turns(monkeypatch) -> list[str]:
    """The turns handed to the gateway's own turn task (``sessions.run_turn``)."""
    dispatched: list[str] = []

    def dispatch_task_now(name: str, run_id: str) -> None:
        assert name == "sessions.run_turn"
        dispatched.append(run_id)

    monkeypatch.setattr(background, "dispatch_task_now", dispatch_task_now)
    return dispatched


def make(key: str) -> Session:
    return sessions.session_create(spec=sessions.SessionSpec(key=key, agent_id="main"))


def send(key: str, run_id: str) -> dict:
    return rpc.chat_send_rpc(_ctx(), schemas.ChatSendParams(sessionKey=key, message="hi", idempotencyKey=run_id))


def _ctx():
    class Ctx:
        channel_name = ""
        scopes = ["operator.write"]

    return Ctx()


# --- who runs a turn ------------------------------------------------------------------------------


def test_without_a_placement_the_gateway_runs_the_turn(django_capture_on_commit_callbacks, port, gateway_turns):
    with django_capture_on_commit_callbacks(execute=True):
        send(make("agent:main:plain").key, "r1")
    assert gateway_turns == ["r1"]


def test_the_ports_runner_receives_its_sessions_turns_after_commit(
    django_capture_on_commit_callbacks, port, gateway_turns
):
    placed, local = make("agent:main:placed"), make("agent:main:local")
    worker = RecordingRunner()
    port.runner = lambda session: worker if session.key == placed.key else None

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        send(placed.key, "r-placed")
        send(local.key, "r-local")
    # Nothing is dispatched before the run's row commits.
    assert worker.dispatched == [] and gateway_turns == []
    for callback in callbacks:
        callback()

    assert worker.dispatched == ["r-placed"]
    assert gateway_turns == ["r-local"]


def test_the_next_queued_turn_goes_to_the_same_runner(django_capture_on_commit_callbacks, port):
    session = make("agent:main:placed")
    worker = RecordingRunner()
    port.runner = lambda s: worker
    with django_capture_on_commit_callbacks(execute=True):
        send(session.key, "r1")
        send(session.key, "r2")
        runs.run_claim(run_id="r1", executor="test")
        runs.run_finish(run_id="r1", outcome=runs.TurnOutcome(status="ok", text="done"))

    assert worker.dispatched == ["r1", "r2", "r2"]  # r2 at submit, and again when r1 ended


def test_the_placement_port_is_provided_once(port):
    with pytest.raises(RuntimeError, match="provided once"):
        ports.provide_placements(TestPort())
    ports.provide_placements(port)  # the same port again is no change
    assert ports.placements() is port


# --- the fields a port adds to session rows ---------------------------------------------------------


def test_contributed_fields_appear_in_describe_list_and_the_api(api_token, port, django_assert_num_queries):
    for n in range(3):
        make(f"agent:main:s{n}")
    calls: list[list[str]] = []

    def residence(batch: Sequence[Session]) -> dict[str, dict]:
        calls.append([s.key for s in batch])
        return {s.key: {"residence": {"host": "gateway", "slot": 0}} for s in batch if s.key != "agent:main:s1"}

    port.fields = residence
    described = rpc.sessions_describe_rpc(_ctx(), schemas.SessionsDescribeParams(key="agent:main:s0"))
    # The page in one query; the port here reads nothing.
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


def test_the_port_is_asked_once_per_page_and_not_for_an_empty_one(port):
    asked: list[list[str]] = []

    def recorder(batch: Sequence[Session]) -> dict[str, dict]:
        asked.append(sorted(s.key for s in batch))
        return {}

    port.fields = recorder
    assert rpc.sessions_list_rpc(_ctx(), schemas.SessionsListParams())["sessions"] == []
    make("agent:main:s0")
    make("agent:main:s1")
    rpc.sessions_list_rpc(_ctx(), schemas.SessionsListParams())
    rpc.sessions_describe_rpc(_ctx(), schemas.SessionsDescribeParams(key="agent:main:s1"))
    assert asked == [["agent:main:s0", "agent:main:s1"], ["agent:main:s1"]]


def test_a_port_may_not_override_session_fields(port):
    make("agent:main:s0")
    port.fields = lambda batch: {s.key: {"status": "hijacked"} for s in batch}
    with pytest.raises(RuntimeError, match=r"overrides session fields \['status'\]"):
        rpc.sessions_describe_rpc(_ctx(), schemas.SessionsDescribeParams(key="agent:main:s0"))


# --- what a port refuses ---------------------------------------------------------------------------------


def test_a_refused_turn_changes_nothing(port):
    session = make("agent:main:moving")
    before = Session.objects.get(pk=session.pk)
    port.refuse = (SessionAction.SEND, "session placement is mid-dispatch")
    with pytest.raises(Unavailable, match="session placement is mid-dispatch"):
        send(session.key, "r1")
    assert not Run.objects.exists()
    after = Session.objects.get(pk=session.pk)
    assert (after.last_run_id, after.last_interaction_at, after.updated_at) == (
        before.last_run_id,
        before.last_interaction_at,
        before.updated_at,
    )
    # Without the refusal the same send is admitted.
    port.refuse = None
    assert send(session.key, "r1") == {"runId": "r1", "status": "started"}


def test_refused_reset_and_delete_change_nothing(port):
    session = make("agent:main:moving")
    port.refuse = (SessionAction.RESET, "no reset while moving")
    with pytest.raises(Unavailable, match="no reset while moving"):
        sessions.session_reset(key=session.key)
    port.refuse = (SessionAction.DELETE, "no delete while moving")
    with pytest.raises(Unavailable, match="no delete while moving"):
        sessions.session_delete(key=session.key)
    current = Session.objects.get(key=session.key)
    assert (current.session_id, current.lifecycle_revision) == (session.session_id, session.lifecycle_revision)
    assert SessionWindow.objects.filter(session=current).count() == 1


def test_a_refused_fork_source_creates_no_child(port):
    source = make("agent:main:source")
    runs.run_submit(session_key=source.key, message="first", idempotency_key="r1")
    runs.run_claim(run_id="r1", executor="test")
    runs.run_finish(run_id="r1", outcome=runs.TurnOutcome(status="ok", text="reply"))
    entry = TranscriptEvent.objects.filter(window_id=source.session_id, body__role="user").get()
    port.refuse = (SessionAction.FORK, "no fork while moving")
    with pytest.raises(Unavailable, match="no fork while moving"):
        forks.session_fork(session_key=source.key, entry_id=entry.event_id)
    assert Session.objects.count() == 1
    port.refuse = None
    assert forks.session_fork(session_key=source.key, entry_id=entry.event_id)["editorText"] == "first"
