"""The session page's settings card: label, archive, reset, delete through sessions.patch|reset|delete's services,
for logins holding those methods' scope (operator.write for a patch of the label or archive, operator.admin for
reset and delete), each form sending the revision the page showed; a page
older than the session changes nothing and says another operator (or a turn) changed it first."""

from __future__ import annotations

import html
import re

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from gateway import scopes as sc
from gateway.audit import Actor
from gateway.models import AuditLog
from sessions_app.models import Run, Session, SessionWindow
from sessions_app.services import runs, sessions
from tests.operator_ui.test_views import make
from tests.support.operators import operator_user

pytestmark = pytest.mark.django_db

CHANGED_FIRST = (
    "Not saved: this session changed after the page showed it (revision {0}, now {1}), by another operator or a "
    "turn. Nothing was changed; the page shows the session as it is now — check it and try again."
)


@pytest.fixture
def staff_client(client):
    client.force_login(operator_user("boss", sc.ADMIN))
    return client


@pytest.fixture(autouse=True)
def _no_dispatch(monkeypatch):
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: None)


def post(client, session, name: str, data: dict):
    return client.post(reverse(f"ui:session-{name}", kwargs={"key": session.key}), data, follow=True)


def messages_of(response) -> list[str]:
    return [message.message for message in get_messages(response.wsgi_request)]


def revisions_in(page: str) -> set[str]:
    return set(re.findall(r'name="revision" value="(\d+)"', page))


def test_the_card_carries_the_revision_the_page_showed_in_every_form(staff_client):
    session = make("agent:main:card", label="shown")
    sessions.session_patch(key=session.key, changes={"pinned": True})

    page = staff_client.get(reverse("ui:session", kwargs={"key": session.key})).content.decode()

    # The title's rename in place, the card's label, archive, reset, delete.
    assert len(re.findall(r'name="revision" value="2"', page)) == 5
    assert 'id="session-label" name="label" value="shown"' in page


def test_a_login_without_the_scope_sees_no_forms_and_its_posts_are_refused(client):
    client.force_login(operator_user("reader", sc.READ))
    session = make("agent:main:plain", label="kept")

    page = client.get(reverse("ui:session", kwargs={"key": session.key})).content.decode()
    refused = [
        client.post(reverse(f"ui:session-{name}", kwargs={"key": session.key}), data)
        for name, data in (
            ("patch", {"label": "x", "revision": "1"}),
            ("reset", {"revision": "1"}),
            ("delete", {"revision": "1"}),
        )
    ]

    assert revisions_in(page) == set() and "Revision" in page
    assert [response.status_code for response in refused] == [403, 403, 403]
    stored = Session.objects.get(key=session.key)
    assert (stored.label, stored.revision, stored.session_id) == ("kept", 1, session.session_id)


def test_a_write_login_may_rename_as_sessions_patch_allows_but_not_reset_or_delete(operator_client):
    """sessions.patch's label needs operator.write (OpenClaw's method-scope table); reset and delete need admin."""
    session = make("agent:main:writer", label="old")

    renamed = post(operator_client, session, "patch", {"label": "New", "revision": "1"})
    refused = [
        operator_client.post(reverse(f"ui:session-{name}", kwargs={"key": session.key}), {"revision": "2"})
        for name in ("reset", "delete")
    ]

    assert messages_of(renamed) == ["Label saved."]
    assert [response.status_code for response in refused] == [403, 403]
    stored = Session.objects.get(key=session.key)
    assert (stored.label, stored.revision, stored.session_id) == ("New", 2, session.session_id)


def test_saving_the_label_with_the_current_revision_is_audited_as_the_user(staff_client):
    session = make("agent:main:rename")

    response = post(staff_client, session, "patch", {"label": "Renamed", "revision": "1"})

    assert messages_of(response) == ["Label saved."]
    stored = Session.objects.get(key=session.key)
    assert (stored.label, stored.revision) == ("Renamed", 2)
    assert revisions_in(response.content.decode()) == {"2"}
    entry = AuditLog.objects.get(action="session.patch", target_id=session.key)
    assert entry.actor == "user:boss" and entry.data == {"changes": {"label": "Renamed"}, "revision": 2}


def test_archive_and_unarchive(staff_client):
    session = make("agent:main:shelf")

    archived = post(staff_client, session, "patch", {"archived": "true", "revision": "1"})
    unarchived = post(staff_client, session, "patch", {"archived": "false", "revision": "2"})

    assert messages_of(archived) == ["Archived."] and messages_of(unarchived) == ["Unarchived."]
    stored = Session.objects.get(key=session.key)
    assert stored.archived_at is None and stored.revision == 3


def test_a_label_from_a_page_another_operator_outdated_changes_nothing(staff_client):
    session = make("agent:main:contended")
    sessions.session_patch(key=session.key, changes={"label": "theirs"}, actor=Actor.system("user:other"))

    response = post(staff_client, session, "patch", {"label": "mine", "revision": "1"})

    assert messages_of(response) == [CHANGED_FIRST.format(1, 2)]
    stored = Session.objects.get(key=session.key)
    assert (stored.label, stored.revision) == ("theirs", 2)
    page = html.unescape(response.content.decode())
    assert CHANGED_FIRST.format(1, 2) in page and revisions_in(page) == {"2"}
    assert not AuditLog.objects.filter(action="session.patch", actor="user:boss").exists()


def test_a_page_outdated_by_a_turn_is_refused_too(staff_client):
    session = make("agent:main:busy")
    runs.run_submit(session_key=session.key, message="hi", idempotency_key="t1")
    runs.run_claim(run_id="t1", executor="test")
    runs.run_finish(run_id="t1", outcome=runs.TurnOutcome(status="ok", text="yo"))

    response = post(staff_client, session, "patch", {"label": "late", "revision": "1"})

    assert messages_of(response) == [CHANGED_FIRST.format(1, 4)]
    assert Session.objects.get(key=session.key).label == ""


def test_a_reset_from_an_outdated_page_changes_nothing(staff_client):
    session = make("agent:main:reset-stale")
    runs.run_submit(session_key=session.key, message="queued", idempotency_key="q1")

    stale = post(staff_client, session, "reset", {"revision": "1"})

    assert messages_of(stale) == [CHANGED_FIRST.format(1, 2)]
    stored = Session.objects.get(key=session.key)
    assert (stored.session_id, stored.revision) == (session.session_id, 2)
    assert SessionWindow.objects.filter(session=stored).count() == 1
    assert Run.objects.get(run_id="q1").status == "queued"

    fresh = post(staff_client, session, "reset", {"revision": "2"})

    assert messages_of(fresh) == ["Reset: a new transcript starts; the previous one is kept."]
    assert Session.objects.get(key=session.key).session_id != session.session_id
    assert AuditLog.objects.filter(action="session.reset", actor="user:boss").count() == 1


def test_a_delete_from_an_outdated_page_keeps_the_session(staff_client):
    session = make("agent:main:doomed")
    sessions.session_patch(key=session.key, changes={"label": "renamed meanwhile"})

    stale = post(staff_client, session, "delete", {"revision": "1"})

    assert messages_of(stale) == [CHANGED_FIRST.format(1, 2)]
    assert Session.objects.filter(key=session.key).exists()

    fresh = post(staff_client, session, "delete", {"revision": "2"})

    assert fresh.redirect_chain[-1][0] == reverse("ui:sessions")
    assert messages_of(fresh) == [f"Deleted {session.key}."]
    assert not Session.objects.filter(key=session.key).exists()
    assert AuditLog.objects.get(action="session.delete").data == {"sessionId": session.session_id, "revision": 2}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"label": "x"}, "the page is out of date: reload it"),
        (
            {"label": "x", "revision": "abc"},
            "/expectedRevision: Input should be a valid integer, unable to parse string as an integer",
        ),
        ({"label": "x", "revision": "0"}, "/expectedRevision: Input should be greater than or equal to 1"),
        ({"label": "x" * 201, "revision": "1"}, "/label: String should have at most 200 characters"),
        ({"revision": "1"}, "sessions.patch needs at least one change"),
        (
            {"archived": "maybe", "revision": "1"},
            "/archived: Input should be a valid boolean, unable to interpret input",
        ),
    ],
)
def test_bad_input_is_refused_with_its_reason_and_changes_nothing(staff_client, data, message):
    session = make("agent:main:strict", label="kept")

    response = post(staff_client, session, "patch", data)

    assert messages_of(response) == [message]
    stored = Session.objects.get(key=session.key)
    assert (stored.label, stored.revision, stored.archived_at) == ("kept", 1, None)
