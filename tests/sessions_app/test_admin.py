"""sessions_app admin: read-only inspection without N+1 queries, audited reset and abort actions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.core.cache import cache
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from gateway.admin.common import audit_history_url
from gateway.models import AuditLog
from sessions_app.models import Run, RunStatus, Session, SessionWindow, ToolArtifact, TranscriptEvent
from sessions_app.services import runs, sessions
from sessions_app.services.runs import abort_key, abort_requested

pytestmark = pytest.mark.django_db

MODELS = [Session, SessionWindow, TranscriptEvent, Run]


@pytest.fixture(autouse=True)
def _no_dispatch(monkeypatch):
    """Turns stay where the test puts them: nothing runs them in the background."""
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: None)


def admin_url(model, view: str, *args) -> str:
    return reverse(f"admin:sessions_app_{model._meta.model_name}_{view}", args=args)


def messages_of(response) -> list[str]:
    return [m.message for m in get_messages(response.wsgi_request)]


def run_action(client, model, action: str, objects):
    data = {"action": action, "_selected_action": [str(o.pk) for o in objects], "index": 0}
    return client.post(admin_url(model, "changelist"), data)


def make(key: str = "agent:main:s1", **fields) -> Session:
    return sessions.session_create(spec=sessions.SessionSpec(key=key, agent_id=key.split(":")[1], **fields))


def queued(session: Session, run_id: str) -> Run:
    return runs.run_submit(session_key=session.key, message="hi", idempotency_key=run_id).run


def running(session: Session, run_id: str) -> Run:
    queued(session, run_id)
    return runs.run_claim(run_id=run_id, executor="celery:test:1").run


def finished(session: Session, run_id: str, text: str = "done") -> Run:
    running(session, run_id)
    return runs.run_finish(run_id=run_id, outcome=runs.TurnOutcome(status=RunStatus.OK, text=text))


@pytest.fixture
def populated() -> Session:
    """A reset session with a finished turn in each window and a queued one."""
    session = make(label="Demo", display_name="Demo session")
    finished(session, "r1", "first")
    session = sessions.session_reset(key=session.key)
    finished(session, "r2", "second")
    queued(session, "r3")
    return session


# --- inspection -----------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_it_renders_the_changelist_and_objects_read_only(admin_client, populated, model):
    changelist = admin_client.get(admin_url(model, "changelist"))
    change = admin_client.get(admin_url(model, "change", model.objects.first().pk))

    assert changelist.status_code == 200
    assert changelist.context["cl"].result_count >= 1
    assert change.status_code == 200
    assert change.context["has_change_permission"] is False
    assert 'name="_save"' not in change.content.decode()


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_changelists_have_no_n_plus_one(admin_client, django_assert_max_num_queries, model):
    for n in range(20):
        session = make(f"agent:main:s{n}", label=f"session {n}")
        finished(session, f"run-{n}", f"reply {n}")

    # Django session, user, the count (+ the planner estimate on PostgreSQL), the page, and on
    # Session the DISTINCT of its three value filters: none of it per row.
    with django_assert_max_num_queries(8 if model is Session else 5):
        response = admin_client.get(admin_url(model, "changelist"))

    assert response.status_code == 200
    assert len(response.context["cl"].result_list) >= 20


def test_session_changelist_shows_state_columns(admin_client):
    archived = make("agent:main:old", label="Old")
    sessions.session_patch(key=archived.key, changes={"archived": True})
    pending = make("agent:main:new", initialization_pending=True)
    finished(make("agent:ops:busy"), "r1")

    response = admin_client.get(admin_url(Session, "changelist"), {"archived": "yes"})
    content = admin_client.get(admin_url(Session, "changelist")).content.decode()

    assert [s.pk for s in response.context["cl"].result_list] == [archived.pk]
    assert pending.key in content
    assert "agent:ops:busy" in content
    assert "done" in content


@pytest.mark.parametrize(
    ("model", "query", "expected"),
    [
        (Session, "archived=no&status__exact=done&agent_id__exact=main", ["agent:main:s1"]),
        (Session, "q=Demo+session", ["agent:main:s1"]),
        (Session, "initialization_pending__exact=1", []),
        (Run, "state=active", ["r3"]),
        (Run, "state=stale", []),
        (Run, "state=abort", []),
        (Run, "status__exact=ok", ["r1", "r2"]),
        (Run, "error_kind=interrupted", []),
        (Run, "q=r2", ["r2"]),
        (SessionWindow, "reason__exact=reset", None),
        (TranscriptEvent, "q=agent:main:s1", None),
    ],
)
def test_it_filters_and_searches(admin_client, populated, model, query, expected):
    response = admin_client.get(admin_url(model, "changelist") + "?" + query)

    # An invalid filter or lookup would redirect to ?e=1 instead.
    assert response.status_code == 200
    rows = response.context["cl"].result_list
    if expected is not None:
        assert sorted(str(getattr(r, "key", r.pk)) for r in rows) == expected
    else:
        assert len(rows) >= 1


def test_links_between_sessions_windows_runs_and_transcripts_are_allowed_lookups(admin_client, populated):
    window = SessionWindow.objects.get(pk=populated.session_id)
    session_page = admin_client.get(admin_url(Session, "change", populated.pk)).content.decode()

    runs = admin_client.get(admin_url(Run, "changelist"), {"session__id__exact": populated.pk})
    entries = admin_client.get(admin_url(TranscriptEvent, "changelist"), {"window__id__exact": window.pk})

    assert f"session__id__exact={populated.pk}" in session_page
    assert f"window__id__exact={window.pk}" in session_page  # the windows inline
    assert sorted(r.pk for r in runs.context["cl"].result_list) == ["r1", "r2", "r3"]
    assert [(e.seq, e.body["role"]) for e in entries.context["cl"].result_list] == [(2, "assistant"), (1, "user")]


def test_transcript_entry_shows_its_body(admin_client, populated):
    event = TranscriptEvent.objects.filter(window_id=populated.session_id, seq=2).get()

    response = admin_client.get(admin_url(TranscriptEvent, "change", event.pk))

    assert response.status_code == 200
    assert "&quot;second&quot;" in response.content.decode()


def test_transcript_changelist_does_not_count_the_table(admin_client, populated):
    model_admin = admin_client.get(admin_url(TranscriptEvent, "changelist")).context["cl"].model_admin

    assert model_admin.show_full_result_count is False
    assert model_admin.get_list_filter(None) == ()


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_rows_cannot_be_added_edited_or_deleted(admin_client, populated, model):
    obj = model.objects.first()

    add = admin_client.get(admin_url(model, "add"))
    save = admin_client.post(admin_url(model, "change", obj.pk), {"_save": "Save"})
    delete = admin_client.post(admin_url(model, "delete", obj.pk), {"post": "yes"})

    assert (add.status_code, save.status_code, delete.status_code) == (403, 403, 403)
    assert model.objects.filter(pk=obj.pk).exists()


def test_actions_need_the_change_permission(populated):
    viewer = User.objects.create_user("viewer", password="x", is_staff=True)
    viewer.user_permissions.add(*Permission.objects.filter(codename__in=["view_session", "view_run"]))
    client = Client()
    client.force_login(viewer)

    for model in (Session, Run):
        response = client.get(admin_url(model, "changelist"))
        assert response.status_code == 200
        assert response.context["action_form"] is None
    refused = run_action(client, Run, "abort_runs", [Run.objects.get(pk="r3")])

    # An action the user may not run is not offered, so the POST just shows the list again.
    assert refused.status_code == 200
    assert Run.objects.get(pk="r3").status == RunStatus.QUEUED
    assert not AuditLog.objects.exists()


# --- reset sessions -------------------------------------------------------------------------


def test_reset_starts_a_new_transcript_and_audits_the_user(admin_client, admin_user):
    session = make()
    finished(session, "r1")
    queued(session, "q1")
    previous = session.session_id

    response = run_action(admin_client, Session, "reset_sessions", [session])

    assert response.status_code == 302
    assert messages_of(response) == ["1 done, 0 skipped"]
    session.refresh_from_db()
    assert session.session_id != previous
    assert SessionWindow.objects.get(pk=session.session_id).previous_session_id == previous
    assert Run.objects.get(pk="q1").status == RunStatus.ERROR
    audit = AuditLog.objects.get()
    assert (audit.action, audit.actor, audit.actor_user) == ("session.reset", "user:admin", admin_user)
    assert (audit.target_type, audit.target_id) == ("session", session.key)
    assert audit.data == {
        "reason": "reset",
        "previousSessionId": previous,
        "sessionId": session.session_id,
        "failedQueuedRuns": 1,
    }
    history = LogEntry.objects.get(object_id=str(session.pk))
    assert (history.action_flag, history.user) == (CHANGE, admin_user)
    assert history.change_message == f"Reset via admin action: sessionId {previous} -> {session.session_id}."


def test_reset_skips_busy_and_initializing_sessions_with_reasons(admin_client):
    idle = make("agent:main:idle")
    busy = make("agent:main:busy")
    running(busy, "r1")
    pending = make("agent:main:pending", initialization_pending=True)
    ids = {s.key: s.session_id for s in (idle, busy, pending)}

    response = run_action(admin_client, Session, "reset_sessions", [idle, busy, pending])

    assert response.status_code == 302
    [message] = messages_of(response)
    assert message.startswith("1 done, 2 skipped: ")
    assert "agent:main:busy: Reset is unavailable while the agent is working." in message
    assert "agent:main:pending: initializing" in message
    assert Session.objects.get(key="agent:main:idle").session_id != ids["agent:main:idle"]
    assert Session.objects.get(key="agent:main:busy").session_id == ids["agent:main:busy"]
    assert Session.objects.get(key="agent:main:pending").session_id == ids["agent:main:pending"]
    assert list(AuditLog.objects.values_list("target_id", flat=True)) == ["agent:main:idle"]
    assert list(LogEntry.objects.values_list("object_id", flat=True)) == [str(idle.pk)]


# --- abort turns ----------------------------------------------------------------------------


@pytest.fixture
def abort_flag_cleanup():
    """The stop request is a cache flag that outlives the test database (in Redis): remove it."""
    yield
    for run in Run.objects.filter(run_id="running"):
        cache.delete(abort_key(run))


def test_abort_ends_queued_turns_and_stops_running_ones(
    admin_client, admin_user, django_capture_on_commit_callbacks, abort_flag_cleanup
):
    first, second = make("agent:main:a"), make("agent:main:b")
    busy = running(first, "running")
    waiting = queued(second, "waiting")

    with django_capture_on_commit_callbacks(execute=True):
        response = run_action(admin_client, Run, "abort_runs", [busy, waiting])

    assert response.status_code == 302
    assert messages_of(response) == ["2 done, 0 skipped"]
    busy.refresh_from_db()
    waiting.refresh_from_db()
    # The running turn is asked to stop; its runner records the end.
    assert (busy.status, busy.abort_requested_at is not None) == (RunStatus.RUNNING, True)
    assert abort_requested(busy)
    assert (waiting.status, waiting.ended_at is not None) == (RunStatus.ABORTED, True)
    audits = {a.target_id: a for a in AuditLog.objects.all()}
    assert audits["agent:main:a"].data == {"runs": {"running": "stop requested"}}
    assert audits["agent:main:b"].data == {"runs": {"waiting": "aborted"}}
    assert {(a.action, a.actor, a.actor_user) for a in audits.values()} == {
        ("session.run.abort", "user:admin", admin_user)
    }
    history = {e.object_id: e.change_message for e in LogEntry.objects.all()}
    assert history == {
        "running": "Stop requested via admin action (was running).",
        "waiting": "Aborted via admin action (was queued).",
    }


def test_abort_skips_finished_turns_and_turns_that_end_meanwhile(admin_client, monkeypatch):
    session = make()
    done = finished(session, "done")
    late = queued(make("agent:main:late"), "late")
    real_abort = runs.run_abort

    def ended_meanwhile(**kwargs):
        if kwargs["run_id"] == "late":
            return []
        return real_abort(**kwargs)

    monkeypatch.setattr(runs, "run_abort", ended_meanwhile)

    response = run_action(admin_client, Run, "abort_runs", [done, late])

    assert response.status_code == 302
    [message] = messages_of(response)
    assert message.startswith("0 done, 2 skipped: ")
    assert f"run done of {session.key}: ok, not queued or running" in message
    assert "run late of agent:main:late: ended meanwhile" in message
    assert not AuditLog.objects.exists()
    assert not LogEntry.objects.exists()


def test_stale_filter_finds_running_turns_without_heartbeat(admin_client):
    quiet = running(make("agent:main:a"), "quiet")
    running(make("agent:main:b"), "beating")
    Run.objects.filter(pk=quiet.pk).update(heartbeat_at=timezone.now() - timedelta(minutes=5))

    response = admin_client.get(admin_url(Run, "changelist"), {"state": "stale"})

    assert [r.pk for r in response.context["cl"].result_list] == ["quiet"]


def test_services_write_no_audit_row_without_an_actor():
    session = make()
    queued(session, "q1")

    runs.run_abort(session_key=session.key, run_id="q1")
    sessions.session_reset(key=session.key)

    assert not AuditLog.objects.exists()


def test_the_session_page_links_its_audit_history(admin_client):
    session = make()
    run_action(admin_client, Session, "reset_sessions", [session])
    other = make("agent:main:other")
    run_action(admin_client, Session, "reset_sessions", [other])

    page = admin_client.get(admin_url(Session, "change", session.pk)).content.decode()
    history_url = audit_history_url(session.key, "session")
    listed = admin_client.get(history_url)

    assert escape(history_url) in page
    assert [(row.action, row.target_id) for row in listed.context["cl"].result_list] == [("session.reset", session.key)]


def test_a_tool_artifact_is_shown_whole_escaped_and_read_only(admin_client):
    session = make()
    run = running(session, "r1")
    artifact = ToolArtifact.objects.create(
        run=run,
        session_key=session.key,
        message_key="s1.r1",
        tool_call_id="c1",
        tool_name="exec",
        content="<script>alert(1)</script>\n" + "x" * 5000,
        size_bytes=5026,
        total_bytes=9000,
    )

    changelist = admin_client.get(admin_url(ToolArtifact, "changelist"))
    change = admin_client.get(admin_url(ToolArtifact, "change", artifact.pk))

    assert changelist.status_code == 200 and artifact.id in changelist.content.decode()
    page = change.content.decode()
    assert change.status_code == 200 and change.context["has_change_permission"] is False
    assert escape("<script>alert(1)</script>") in page and "<script>alert(1)</script>" not in page
    assert "x" * 5000 in page
