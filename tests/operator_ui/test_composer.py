"""The session page's script posts its forms with fetch and asks for JSON: sending a message (the run's id, or the
service's refusal), stopping a turn, renaming the session in place (the saved label, the new revision and the
page's title, or the refusal), each through the same view and service as the form posted without JavaScript,
which still redirects. Also the page's title (the label, else the key's last part) and a label at creation."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from gateway import scopes as sc
from gateway.models import AuditLog
from sessions_app.models import Run, RunStatus, Session
from sessions_app.services import runs, sessions
from tests.operator_ui.test_views import make, session_url, text_of
from tests.support.operators import operator_user

pytestmark = pytest.mark.django_db

AS_SCRIPT = {"Accept": "application/json", "X-Requested-With": "console"}


@pytest.fixture(autouse=True)
def _no_dispatch(monkeypatch):
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: None)


def send_url(session: Session) -> str:
    return reverse("ui:session-send", kwargs={"key": session.key})


def form_key(client, session: Session) -> str:
    return re.search(r'name="idempotencyKey" value="([^"]+)"', text_of(client.get(session_url(session)))).group(1)


# --- sending ---------------------------------------------------------------------------------------


def test_a_message_sent_by_the_script_answers_its_run_and_a_key_for_the_next_form(operator_client):
    session = make("agent:main:composer")
    key = form_key(operator_client, session)

    answer = operator_client.post(send_url(session), {"message": "hello", "idempotencyKey": key}, headers=AS_SCRIPT)

    assert answer.status_code == 200 and answer["Content-Type"] == "application/json"
    body = answer.json()
    run = Run.objects.get(session=session)
    assert (body["ok"], body["runId"], body["status"], body["repeated"]) == (True, run.run_id, "queued", False)
    assert body["nextIdempotencyKey"] not in ("", key)
    assert run.message == "hello"


def test_a_resent_form_is_still_one_turn_and_says_it_was_repeated(operator_client):
    session = make("agent:main:twice")
    key = form_key(operator_client, session)

    first = operator_client.post(send_url(session), {"message": "once", "idempotencyKey": key}, headers=AS_SCRIPT)
    again = operator_client.post(send_url(session), {"message": "once", "idempotencyKey": key}, headers=AS_SCRIPT)
    posted = operator_client.post(send_url(session), {"message": "once", "idempotencyKey": key})

    assert first.json()["runId"] == again.json()["runId"]
    assert again.json()["repeated"] is True
    assert posted.status_code == 302 and posted["Location"] == session_url(session)
    assert Run.objects.filter(session=session).count() == 1


@pytest.mark.parametrize(
    ("message", "error"),
    [("", "message"), ("   \n\t ", "message or attachment required"), ("a\x00b", "message")],
)
def test_a_refused_message_answers_the_services_words_and_writes_nothing(operator_client, message, error):
    session = make("agent:main:refused-json")

    answer = operator_client.post(send_url(session), {"message": message, "idempotencyKey": "r1"}, headers=AS_SCRIPT)

    assert answer.status_code == 400
    assert answer.json()["ok"] is False and error in answer.json()["error"]
    assert not Run.objects.filter(session=session).exists()


def test_a_form_posted_without_the_script_still_redirects_with_the_refusal(operator_client):
    session = make("agent:main:no-script")

    refused = operator_client.post(send_url(session), {"message": "  ", "idempotencyKey": "n1"}, follow=True)

    assert refused.redirect_chain == [(session_url(session), 302)]
    assert "message or attachment required" in text_of(refused)
    assert not Run.objects.filter(session=session).exists()


def test_a_key_of_another_sessions_turn_is_refused_as_json(operator_client):
    first, other = make("agent:main:first"), make("agent:main:other")
    runs.run_submit(session_key=first.key, message="mine", idempotency_key="shared-key")

    answer = operator_client.post(
        send_url(other), {"message": "theirs", "idempotencyKey": "shared-key"}, headers=AS_SCRIPT
    )

    assert answer.status_code == 400
    assert answer.json() == {"ok": False, "error": "idempotencyKey already used for another session"}
    assert not Run.objects.filter(session=other).exists()


def test_a_reader_cannot_send_with_the_script_either(client):
    client.force_login(operator_user("reader", sc.READ))
    session = make("agent:main:read-only")

    answer = client.post(send_url(session), {"message": "hi", "idempotencyKey": "x"}, headers=AS_SCRIPT)

    assert answer.status_code == 403
    assert not Run.objects.filter(session=session).exists()


# --- stopping --------------------------------------------------------------------------------------


def test_stop_by_the_script_answers_what_it_did_and_is_audited(operator_client):
    session = make("agent:main:stop-json")
    runs.run_submit(session_key=session.key, message="long job", idempotency_key="stop-1")
    runs.run_claim(run_id="stop-1", executor="test")
    url = reverse("ui:session-abort", kwargs={"key": session.key})

    stopped = operator_client.post(url, headers=AS_SCRIPT)
    runs.run_finish(run_id="stop-1", outcome=runs.TurnOutcome(status="aborted", text=""))
    nothing = operator_client.post(url, headers=AS_SCRIPT)

    assert stopped.json() == {"ok": True, "message": "Asked 1 turn(s) to stop."}
    assert nothing.json() == {"ok": True, "message": "No turn was running."}
    assert Run.objects.get(run_id="stop-1").abort_requested_at is not None
    assert AuditLog.objects.filter(action="session.run.abort", actor="user:ops").count() == 1


# --- the title and renaming in place -----------------------------------------------------------------


def title_of(page: str) -> tuple[str, str]:
    document_title = re.search(r"<title>(.*?) · OpenClaw console</title>", page).group(1)
    heading = re.search(r'<h1 id="session-title"[^>]*>(.*?)</h1>', page).group(1)
    return document_title, heading


def test_the_title_is_the_label_else_the_keys_last_part_with_the_whole_key_shown(operator_client):
    named = make("agent:main:named", label="Release <notes>")
    plain = make("agent:main:dashboard:0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")

    named_page, plain_page = (
        text_of(operator_client.get(session_url(named))),
        text_of(operator_client.get(session_url(plain))),
    )

    assert title_of(named_page) == ("Release &lt;notes&gt;", "Release &lt;notes&gt;")
    assert title_of(plain_page) == ("0f1e2d3c-4b5a-6978-8796…", "0f1e2d3c-4b5a-6978-8796…")
    assert '<span class="session-key">agent:main:dashboard:0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0</span>' in plain_page


def patch_url(session: Session) -> str:
    return reverse("ui:session-patch", kwargs={"key": session.key})


def test_a_rename_in_place_answers_the_label_revision_and_title(operator_client):
    session = make("agent:main:rename")

    answer = operator_client.post(patch_url(session), {"revision": "1", "label": "  Weekly report "}, headers=AS_SCRIPT)

    assert answer.json() == {
        "ok": True,
        "message": "Label saved.",
        "label": "Weekly report",
        "revision": 2,
        "title": "Weekly report",
        "fallback": False,
    }
    assert AuditLog.objects.filter(action="session.patch", target_id=session.key).count() == 1


def test_clearing_the_label_in_place_gives_the_fallback_title(operator_client):
    session = make("agent:main:cleared", label="Old name")

    answer = operator_client.post(patch_url(session), {"revision": "1", "label": ""}, headers=AS_SCRIPT)

    assert (answer.json()["title"], answer.json()["fallback"], answer.json()["label"]) == ("cleared", True, "")


def test_a_rename_of_a_page_older_than_the_session_is_refused_as_json_and_changes_nothing(operator_client):
    session = make("agent:main:raced")
    sessions.session_patch(key=session.key, changes={"label": "Someone else's"}, expected_revision=1)

    answer = operator_client.post(patch_url(session), {"revision": "1", "label": "Mine"}, headers=AS_SCRIPT)

    assert answer.status_code == 409
    assert answer.json()["error"].startswith(
        "Not saved: this session changed after the page showed it (revision 1, now 2)"
    )
    stored = Session.objects.get(key=session.key)
    assert (stored.label, stored.revision) == ("Someone else's", 2)
    assert not AuditLog.objects.filter(action="session.patch").exists()


def test_a_too_long_label_is_refused_as_json_and_changes_nothing(operator_client):
    session = make("agent:main:too-long")

    answer = operator_client.post(patch_url(session), {"revision": "1", "label": "x" * 201}, headers=AS_SCRIPT)

    assert answer.status_code == 400
    assert answer.json() == {"ok": False, "error": "/label: String should have at most 200 characters"}
    assert Session.objects.get(key=session.key).revision == 1


def test_a_reader_gets_no_rename_control(client):
    client.force_login(operator_user("reader", sc.READ))
    session = make("agent:main:read-title", label="Read me")

    page = text_of(client.get(session_url(session)))

    assert "rename-form" not in page and "data-rename-title" not in page
    assert title_of(page) == ("Read me", "Read me")


# --- a label at creation ---------------------------------------------------------------------------


def test_a_session_created_with_a_label_has_it_as_its_title(operator_client):
    created = operator_client.post(reverse("ui:session-new"), {"key": "agent:main:labelled", "label": " Triage "})

    assert created.status_code == 302
    assert Session.objects.get(key="agent:main:labelled").label == "Triage"
    assert title_of(text_of(operator_client.get(created["Location"]))) == ("Triage", "Triage")


def test_a_too_long_label_at_creation_is_refused_and_creates_nothing(operator_client):
    refused = operator_client.post(
        reverse("ui:session-new"), {"key": "agent:main:unnamed", "label": "y" * 201}, follow=True
    )

    assert "/label: String should have at most 200 characters" in text_of(refused)
    assert not Session.objects.exists()


def test_the_page_lists_the_runs_stored_as_queued_or_running_for_its_script(operator_client):
    session = make("agent:main:active-runs")
    runs.run_submit(session_key=session.key, message="first", idempotency_key="active-1")
    runs.run_claim(run_id="active-1", executor="test")
    runs.run_submit(session_key=session.key, message="second", idempotency_key="active-2")

    running = text_of(operator_client.get(session_url(session)))
    runs.run_finish(run_id="active-1", outcome=runs.TurnOutcome(status="ok", text="done"))
    Run.objects.filter(run_id="active-2").update(status=RunStatus.ABORTED)
    settled = text_of(operator_client.get(session_url(session)))

    assert 'data-active-runs="active-1 active-2"' in running or 'data-active-runs="active-2 active-1"' in running
    assert 'data-active-runs=""' in settled
