"""The operators' console pages through Django's test client: who may see them, what they show, and that
their actions go through the RPC's services (same bounds, same refusals, nothing written on a refusal)."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from gateway import scopes as sc
from sessions_app.models import Run, Session
from sessions_app.services import runs
from sessions_app.services.sessions import SessionSpec, session_create
from tests.operator_ui.conftest import PASSWORD
from tests.support.operators import operator_user
from tests.workers_app.test_inference_proxy import placed_session

pytestmark = pytest.mark.django_db


def make(key: str, **fields) -> Session:
    return session_create(spec=SessionSpec(key=key, agent_id="main", **fields))


def session_url(session: Session) -> str:
    return reverse("ui:session", kwargs={"key": session.key})


def text_of(response) -> str:
    return response.content.decode()


# --- who may see the pages -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ui:sessions"])
def test_pages_send_an_anonymous_visitor_to_the_login_page(client, name):
    response = client.get(reverse(name))

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("ui:login") + "?next=")


def test_an_anonymous_post_creates_nothing(client):
    response = client.post(reverse("ui:session-new"), {"key": "agent:main:sneaky"})

    assert response.status_code == 302 and response["Location"].startswith(reverse("ui:login"))
    assert not Session.objects.filter(key="agent:main:sneaky").exists()


def test_an_operator_logs_in_with_the_django_login_and_lands_on_the_sessions(client, django_user_model):
    operator_user("ops", sc.WRITE)

    page = client.get(reverse("ui:login"))
    wrong = client.post(reverse("ui:login"), {"username": "ops", "password": "nope"})
    right = client.post(reverse("ui:login"), {"username": "ops", "password": PASSWORD})

    assert page.status_code == 200 and 'name="password"' in text_of(page)
    assert wrong.status_code == 200 and "did not match" in text_of(wrong)
    assert right.status_code == 302 and right["Location"] == reverse("ui:home")
    assert client.get(reverse("ui:home"))["Location"] == reverse("ui:sessions")
    assert client.get(reverse("ui:sessions")).status_code == 200


def test_logging_out_ends_the_session(operator_client):
    response = operator_client.post(reverse("ui:logout"))

    assert response.status_code == 302
    assert operator_client.get(reverse("ui:sessions")).status_code == 302


# --- sessions list ---------------------------------------------------------------------------------


def test_the_list_shows_sessions_newest_first_with_their_placement(operator_client):
    make("agent:main:older", label="Older one")
    placed = placed_session()
    make("agent:main:newest")

    page = text_of(operator_client.get(reverse("ui:sessions")))

    assert page.index("agent:main:newest") < page.index(placed.key) < page.index("Older one")
    assert 'class="pill pill-ok">active<' in page


def test_search_and_the_archived_filter_narrow_the_list(operator_client):
    make("agent:main:alpha", label="Release review")
    make("agent:main:beta")
    Session.objects.filter(key="agent:main:beta").update(archived_at="2026-01-01T00:00:00Z")

    searched = text_of(operator_client.get(reverse("ui:sessions"), {"q": "release"}))
    archived = text_of(operator_client.get(reverse("ui:sessions"), {"archived": "yes"}))
    nothing = text_of(operator_client.get(reverse("ui:sessions"), {"q": "no-such-thing"}))

    assert "agent:main:alpha" in searched and "agent:main:beta" not in searched
    assert "agent:main:beta" in archived and "agent:main:alpha" not in archived
    assert "No session matches these filters." in nothing


def test_an_empty_list_says_how_to_start(operator_client):
    assert "No sessions yet." in text_of(operator_client.get(reverse("ui:sessions")))


def test_pages_hold_fifty_sessions_and_link_to_the_next(operator_client):
    for index in range(55):
        make(f"agent:main:s{index:03d}")

    first = text_of(operator_client.get(reverse("ui:sessions")))
    second = text_of(operator_client.get(reverse("ui:sessions"), {"page": 2}))
    garbage = operator_client.get(reverse("ui:sessions"), {"page": "x"})

    assert first.count('href="/ui/sessions/agent:main:s') == 50 and 'rel="next"' in first
    assert second.count('href="/ui/sessions/agent:main:s') == 5 and 'rel="next"' not in second
    assert 'rel="prev"' in second
    assert garbage.status_code == 200


def test_the_list_costs_the_same_queries_for_few_and_many_sessions(operator_client, django_assert_max_num_queries):
    for index in range(3):
        make(f"agent:main:few{index}")
    placed_session()
    with django_assert_max_num_queries(8) as few:
        operator_client.get(reverse("ui:sessions"))
    for index in range(60):
        make(f"agent:main:many{index}")
    with django_assert_max_num_queries(len(few.captured_queries)):
        operator_client.get(reverse("ui:sessions"))


# --- a session -------------------------------------------------------------------------------------


def test_a_session_page_shows_its_transcript_turns_and_placement(operator_client):
    session = placed_session()
    submitted = runs.run_submit(session_key=session.key, message="What changed today?", idempotency_key="k1").run
    runs.run_claim(run_id=submitted.run_id, executor="test")

    page = text_of(operator_client.get(session_url(session)))

    assert "What changed today?" in page
    assert 'class="pill pill-info">running<' in page
    assert '<dt>State</dt><dd><span class="state state-active">active</span></dd>' in page
    assert "worker:inference" in page


def test_a_local_session_says_this_gateway_runs_its_turns(operator_client):
    session = make("agent:main:plain")

    page = text_of(operator_client.get(session_url(session)))

    assert "Local: this gateway runs the session" in page
    assert "No messages yet." in page and "No turns yet." in page


def test_an_unknown_or_malformed_session_is_404(operator_client):
    assert operator_client.get(reverse("ui:session", kwargs={"key": "agent:main:nope"})).status_code == 404
    assert operator_client.get("/ui/sessions/agent::/").status_code == 404


def test_sending_a_message_submits_a_turn_once_per_form(operator_client):
    session = make("agent:main:chat")
    form = text_of(operator_client.get(session_url(session)))
    key = re.search(r'name="idempotencyKey" value="([^"]+)"', form).group(1)
    url = reverse("ui:session-send", kwargs={"key": session.key})

    first = operator_client.post(url, {"message": "hello", "idempotencyKey": key})
    again = operator_client.post(url, {"message": "hello", "idempotencyKey": key})  # a resubmitted form

    assert first.status_code == again.status_code == 302 and first["Location"] == session_url(session)
    assert list(Run.objects.filter(session=session).values_list("message", flat=True)) == ["hello"]


def test_a_refused_message_shows_the_services_error_and_writes_nothing(operator_client):
    session = make("agent:main:refused")
    url = reverse("ui:session-send", kwargs={"key": session.key})

    empty = operator_client.post(url, {"message": "", "idempotencyKey": "e1"}, follow=True)
    nul = operator_client.post(url, {"message": "a\x00b", "idempotencyKey": "e2"}, follow=True)

    assert empty.status_code == 200 and 'class="error"' in text_of(empty)
    assert "message" in text_of(empty).split('class="error">', 1)[1].split("<", 1)[0]
    assert nul.status_code == 200 and 'class="error"' in text_of(nul)
    assert not Run.objects.filter(session=session).exists()


def test_creating_a_session_opens_its_page_and_a_bad_key_is_refused(operator_client):
    created = operator_client.post(reverse("ui:session-new"), {"key": "agent:main:fresh"})
    refused = operator_client.post(reverse("ui:session-new"), {"key": "agent:"}, follow=True)

    assert created.status_code == 302 and created["Location"] == "/ui/sessions/agent:main:fresh/"
    assert Session.objects.filter(key="agent:main:fresh").exists()
    assert "invalid session key" in text_of(refused)
    assert Session.objects.count() == 1


def test_posts_without_a_csrf_token_are_refused(django_user_model):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator_user("ops", sc.WRITE))
    session = make("agent:main:csrf")

    response = strict.post(reverse("ui:session-send", kwargs={"key": session.key}), {"message": "hi"})

    assert response.status_code == 403
    assert not Run.objects.filter(session=session).exists()


def test_pages_only_answer_their_methods(operator_client):
    assert operator_client.post(reverse("ui:sessions")).status_code == 405
    assert operator_client.get(reverse("ui:session-new")).status_code == 405
