"""Forking a session from one of its messages in the console: the same service as ``sessions.fork``; the new
session opens with the history before the message and the message in its composer; a refusal shows the
service's exact message on the source's page and creates nothing."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from gateway import scopes as sc
from gateway.models import AuditLog
from sessions_app.models import Session, TranscriptEvent
from sessions_app.services import runs
from sessions_app.services.sessions import session_reset
from sessions_app.services.transcripts import append_many
from tests.operator_ui.test_session_actions import messages_of, page_of
from tests.operator_ui.test_views import make
from tests.support.operators import operator_user

pytestmark = pytest.mark.django_db


def with_transcript(key: str, *turns: tuple[str, str]) -> tuple[Session, list[TranscriptEvent]]:
    session = make(key)
    bodies = [{"role": role, "content": [{"type": "text", "text": text}], "timestamp": 1} for role, text in turns]
    append_many(window_id=session.session_id, session_key=session.key, bodies=bodies)
    return session, list(TranscriptEvent.objects.filter(window_id=session.session_id).order_by("seq"))


def fork(client, session, entry_id: str | None):
    data = {} if entry_id is None else {"entryId": entry_id}
    return client.post(reverse("ui:session-fork", kwargs={"key": session.key}), data, follow=True)


def texts_of(session: Session) -> list[tuple[str, str]]:
    return [
        (event.body["role"], event.body["content"][0]["text"])
        for event in TranscriptEvent.objects.filter(window_id=session.session_id).order_by("seq")
    ]


def composer_of(page: str) -> str:
    return re.search(r'<textarea id="message" name="message"[^>]*>(.*?)</textarea>', page, re.S).group(1)


QUESTIONS = (
    ("user", "first question"),
    ("assistant", "first answer"),
    ("user", "second question"),
    ("assistant", "ok"),
)


def test_each_user_message_offers_a_fork_and_the_others_do_not(operator_client):
    session, events = with_transcript("agent:main:offers", *QUESTIONS)

    page = page_of(operator_client, session)

    offered = re.findall(r'name="entryId" value="([^"]+)"', page)
    assert offered == [events[0].event_id, events[2].event_id]
    assert page.count(">Fork from here<") == 2
    assert f'action="{reverse("ui:session-fork", kwargs={"key": session.key})}"' in page


def test_forking_opens_the_new_session_with_the_message_in_its_composer(operator_client):
    session, events = with_transcript("agent:main:source", *QUESTIONS)

    response = fork(operator_client, session, events[2].event_id)

    child = Session.objects.exclude(pk=session.pk).get()
    assert response.redirect_chain == [(reverse("ui:session", kwargs={"key": child.key}), 302)]
    assert messages_of(response) == [f"Forked from {session.key}: the message you forked at is in the composer."]
    page = response.content.decode()
    assert composer_of(page) == "second question"
    assert "first question" in page and "first answer" in page
    assert texts_of(child) == [("user", "first question"), ("assistant", "first answer")]
    assert (child.fork_source_session_key, child.fork_source_entry_id) == (session.key, events[2].event_id)
    assert texts_of(session) == list(QUESTIONS)  # the source is untouched
    audit = AuditLog.objects.get(action="session.fork")
    assert (audit.actor, audit.actor_user.username, audit.target_id) == ("user:ops", "ops", session.key)
    assert audit.data == {
        "entryId": events[2].event_id,
        "sourceSessionId": session.session_id,
        "sessionKey": child.key,
    }
    # The draft is handed over once: a reload (or a live refresh) shows an empty composer.
    assert composer_of(page_of(operator_client, child)) == ""


def test_forking_at_the_first_message_makes_an_empty_session(operator_client):
    session, events = with_transcript("agent:main:first", *QUESTIONS)

    response = fork(operator_client, session, events[0].event_id)

    child = Session.objects.exclude(pk=session.pk).get()
    assert texts_of(child) == []
    assert "No messages yet." in response.content.decode()
    assert composer_of(response.content.decode()) == "first question"


def refused(client, session, entry_id: str | None) -> list[str]:
    """Fork, expect a refusal on the source's page, and check that nothing was created."""
    sessions_before = Session.objects.count()
    response = fork(client, session, entry_id)
    assert response.redirect_chain == [(reverse("ui:session", kwargs={"key": session.key}), 302)]
    assert 'class="error"' in response.content.decode()
    assert Session.objects.count() == sessions_before
    assert not AuditLog.objects.filter(action="session.fork").exists()
    return messages_of(response)


def test_a_fork_at_a_reply_or_an_unknown_entry_is_the_services_refusal(operator_client):
    session, events = with_transcript("agent:main:refusals", *QUESTIONS)

    assert refused(operator_client, session, events[1].event_id) == [
        f"entry is not a user message: {events[1].event_id}"
    ]
    assert refused(operator_client, session, "nope") == ["message entry not found: nope"]
    assert refused(operator_client, session, "") == ["/entryId: String should have at least 1 character"]
    assert refused(operator_client, session, None) == ["/entryId: must have required property"]


def test_a_page_drawn_before_a_reset_is_refused_with_the_services_message(operator_client):
    session, events = with_transcript("agent:main:moved-on", *QUESTIONS)
    page = page_of(operator_client, session)
    assert events[2].event_id in page
    session_reset(key=session.key)  # the state moved on: the message left the active path

    assert refused(operator_client, session, events[2].event_id) == [
        f"message entry is not on the active path: {events[2].event_id}"
    ]


def test_a_fork_while_the_agent_is_working_is_refused(operator_client):
    session, events = with_transcript("agent:main:working", *QUESTIONS)
    runs.run_submit(session_key=session.key, message="long job", idempotency_key="working-1")
    runs.run_claim(run_id="working-1", executor="test")

    assert refused(operator_client, session, events[0].event_id) == ["Fork is unavailable while the agent is working."]


def test_a_fork_of_an_initializing_session_is_refused(operator_client):
    session, events = with_transcript("agent:main:initializing", *QUESTIONS)
    Session.objects.filter(pk=session.pk).update(initialization_pending=True)

    assert refused(operator_client, session, events[0].event_id) == [
        f"Session {session.key} is initializing; retry fork later."
    ]


def test_a_fork_of_an_unknown_session_is_404_and_a_get_is_not_allowed(operator_client):
    session, _ = with_transcript("agent:main:methods", *QUESTIONS)

    unknown = operator_client.post(reverse("ui:session-fork", kwargs={"key": "agent:main:ghost"}), {"entryId": "x"})
    get = operator_client.get(reverse("ui:session-fork", kwargs={"key": session.key}))

    assert (unknown.status_code, get.status_code) == (404, 405)
    assert Session.objects.count() == 1


def test_an_anonymous_or_deactivated_visitor_cannot_fork(client, django_user_model):
    session, events = with_transcript("agent:main:guarded", *QUESTIONS)
    url = reverse("ui:session-fork", kwargs={"key": session.key})

    anonymous = client.post(url, {"entryId": events[0].event_id})
    user = operator_user("gone", sc.WRITE)
    client.force_login(user)
    django_user_model.objects.filter(pk=user.pk).update(is_active=False)
    deactivated = client.post(url, {"entryId": events[0].event_id})

    for response in (anonymous, deactivated):
        assert response.status_code == 302 and response["Location"].startswith(reverse("ui:login"))
    assert Session.objects.count() == 1
    assert not AuditLog.objects.filter(action="session.fork").exists()


def test_a_fork_without_a_csrf_token_is_refused(django_user_model):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator_user("ops", sc.WRITE))
    session, events = with_transcript("agent:main:csrf-fork", *QUESTIONS)

    response = strict.post(reverse("ui:session-fork", kwargs={"key": session.key}), {"entryId": events[0].event_id})

    assert response.status_code == 403
    assert Session.objects.count() == 1
