"""The session row's ``revision``: 1 when created, +1 on every write of the row, and ``expectedRevision`` on
sessions.patch|reset|delete refusing a caller that read an older revision (nothing changes)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from pydantic import ValidationError

from gateway.exceptions import Conflict, NotFound
from sessions_app import selectors, tasks
from sessions_app.models import Run, Session, SessionWindow
from sessions_app.rpc import sessions_delete_rpc, sessions_patch_rpc, sessions_reset_rpc
from sessions_app.schemas import SessionsDeleteParams, SessionsListParams, SessionsPatchParams, SessionsResetParams
from sessions_app.services import initialization, runs, sessions
from sessions_app.services.rows import session_delete_row, session_write

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_dispatch(monkeypatch):
    """Turns are driven by the tests (claim, finish), not by a runner."""
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: None)


def make(key: str = "agent:main:rev") -> Session:
    return sessions.session_create(spec=sessions.SessionSpec(key=key, agent_id="main"))


def revision_of(key: str) -> int:
    return Session.objects.get(key=key).revision


def test_every_write_of_the_row_bumps_the_revision_by_one():
    session = make()
    steps = [("create", lambda: None)]
    steps += [
        ("patch", lambda: sessions.session_patch(key=session.key, changes={"label": "one"})),
        ("send", lambda: runs.run_submit(session_key=session.key, message="hi", idempotency_key="r1")),
        ("turn start", lambda: runs.run_claim(run_id="r1", executor="test")),
        ("turn end", lambda: runs.run_finish(run_id="r1", outcome=runs.TurnOutcome(status="ok", text="yo"))),
        ("archive", lambda: sessions.session_patch(key=session.key, changes={"archived": True})),
        ("reset", lambda: sessions.session_reset(key=session.key)),
        ("send again", lambda: runs.run_submit(session_key=session.key, message="hi", idempotency_key="r2")),
        ("turn start again", lambda: runs.run_claim(run_id="r2", executor="celery:host:1")),
        ("dead turn failed", _fail_silent_turns),
    ]

    seen = []
    for name, write in steps:
        write()
        seen.append((name, revision_of(session.key)))

    assert seen == [(name, number) for number, (name, _) in enumerate(steps, start=1)]
    assert Run.objects.get(run_id="r2").status == "error"


def _fail_silent_turns() -> None:
    Run.objects.filter(run_id="r2").update(heartbeat_at=timezone.now() - timedelta(minutes=5))
    assert tasks.runs_sweep()["failed"] == ["r2"]


def test_reads_and_refused_writes_leave_the_revision_alone():
    session = make()
    runs.run_submit(session_key=session.key, message="one", idempotency_key="r1")
    before = revision_of(session.key)

    selectors.session_row_of(session.key)
    selectors.chat_history(session, limit=10)
    runs.run_claim(run_id="missing", executor="test")  # not this caller's to run
    with pytest.raises(Conflict):
        sessions.session_patch(key=session.key, changes={"label": "x"}, expected_session_id="other")
    runs.run_abort(session_key=session.key)  # a queued turn ends: the run's row, not the session's

    assert revision_of(session.key) == before


def test_the_readiness_of_an_initialization_is_a_write():
    created = initialization.create_session_entry(
        key="agent:main:owned", agent_id="main", agent_harness_id="native", after_create=lambda context: {}
    )

    assert created.session.revision == 2  # the pending row, then its readiness
    assert revision_of("agent:main:owned") == 2


def test_rows_show_the_revision_as_stored():
    session = make()

    patched = sessions_patch_rpc(None, SessionsPatchParams(key=session.key, label="shown", expectedRevision=1))

    assert patched["entry"]["revision"] == 2
    assert selectors.session_row_of(session.key)["revision"] == 2
    assert selectors.sessions_list_payload(SessionsListParams())["sessions"][0]["revision"] == 2


# --- expectedRevision: a caller that read an older revision changes nothing ----------------------------


def test_a_patch_with_the_current_revision_wins_and_a_stale_one_is_refused():
    session = make()
    sessions.session_patch(key=session.key, changes={"label": "first"}, expected_revision=1)

    with pytest.raises(Conflict) as stale:
        sessions.session_patch(key=session.key, changes={"label": "lost"}, expected_revision=1)

    assert stale.value.message == ("Session agent:main:rev changed: expected revision 1, current revision 2; retry.")
    stored = Session.objects.get(key=session.key)
    assert stale.value.details == {
        "code": "SESSION_CHANGED",
        "sessionId": stored.session_id,
        "lifecycleRevision": stored.lifecycle_revision,
        "revision": 2,
    }
    assert (stored.label, stored.revision) == ("first", 2)


def test_a_reset_with_a_stale_revision_changes_nothing():
    session = make()
    runs.run_submit(session_key=session.key, message="queued", idempotency_key="q1")

    with pytest.raises(Conflict, match="expected revision 1, current revision 2"):
        sessions_reset_rpc(None, SessionsResetParams(key=session.key, expectedRevision=1))

    stored = Session.objects.get(key=session.key)
    assert (stored.session_id, stored.lifecycle_revision, stored.revision) == (
        session.session_id,
        session.lifecycle_revision,
        2,
    )
    assert SessionWindow.objects.filter(session=stored).count() == 1
    assert Run.objects.get(run_id="q1").status == "queued"


def test_a_reset_with_the_current_revision_goes_through():
    session = make()

    reset = sessions_reset_rpc(None, SessionsResetParams(key=session.key, expectedRevision=1))

    assert reset["entry"]["sessionId"] != session.session_id
    assert reset["entry"]["revision"] == 2


def test_a_delete_with_a_stale_revision_keeps_the_session():
    session = make()
    sessions.session_patch(key=session.key, changes={"pinned": True})

    with pytest.raises(Conflict, match="expected revision 1, current revision 2"):
        sessions_delete_rpc(None, SessionsDeleteParams(key=session.key, expectedRevision=1))
    deleted = sessions_delete_rpc(None, SessionsDeleteParams(key=session.key, expectedRevision=2))

    assert deleted == {"ok": True, "key": session.key, "deleted": True, "archived": []}
    assert not Session.objects.filter(key=session.key).exists()


def test_a_stale_revision_is_refused_before_the_other_guards_of_the_call():
    """Both guards hold the same row: a stale revision with a matching sessionId is still stale."""
    session = make()
    sessions.session_patch(key=session.key, changes={"label": "moved on"})

    with pytest.raises(Conflict, match="expected revision 1, current revision 2"):
        sessions.session_patch(
            key=session.key,
            changes={"label": "x"},
            expected_session_id=session.session_id,
            expected_lifecycle_revision=session.lifecycle_revision,
            expected_revision=1,
        )

    assert Session.objects.get(key=session.key).label == "moved on"


@pytest.mark.parametrize("value", [0, -1, 2**53, "x", 1.5])
def test_an_expected_revision_out_of_range_is_bad_input(value):
    with pytest.raises(ValidationError, match="expectedRevision"):
        SessionsPatchParams.model_validate({"key": "agent:main:rev", "label": "x", "expectedRevision": value})


# --- the compare-and-set itself (no lock held: the revision alone decides) ------------------------------


def test_a_write_from_an_outdated_copy_of_the_row_is_refused_and_writes_nothing():
    copy = make()
    sessions.session_patch(key=copy.key, changes={"label": "newer"})

    copy.label = "older"
    with pytest.raises(Conflict, match="expected revision 1, current revision 2"):
        session_write(copy, "label")
    with pytest.raises(Conflict, match="expected revision 1, current revision 2"):
        session_delete_row(copy)

    stored = Session.objects.get(key=copy.key)
    assert (stored.label, stored.revision) == ("newer", 2)
    assert copy.revision == 1


def test_a_write_to_a_row_that_is_gone_says_so():
    copy = make()
    Session.objects.filter(pk=copy.pk).delete()

    with pytest.raises(NotFound, match="session not found: agent:main:rev"):
        session_write(copy, "label")


def test_a_delete_guarded_by_openclaws_updated_at_refuses_a_row_written_since():
    """``expectedSessionUpdatedAt`` (OpenClaw's sessions.delete guard): the row's ``updatedAt`` as rows show it."""
    session = make()
    Session.objects.filter(pk=session.pk).update(updated_at=timezone.now() - timedelta(seconds=5))
    seen = selectors.session_row_of(session.key)["updatedAt"]
    sessions.session_patch(key=session.key, changes={"label": "written since"})

    with pytest.raises(Conflict, match=r"^Session agent:main:rev changed; retry\.$"):
        sessions_delete_rpc(None, SessionsDeleteParams(key=session.key, expectedSessionUpdatedAt=seen))
    current = selectors.session_row_of(session.key)["updatedAt"]
    deleted = sessions_delete_rpc(None, SessionsDeleteParams(key=session.key, expectedSessionUpdatedAt=current))

    assert deleted["deleted"] is True
    assert not Session.objects.filter(key=session.key).exists()
