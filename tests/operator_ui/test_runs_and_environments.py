"""The console's runs page (every session's turns, newest first, filtered by status, paged) and
environments page (worker environments with their state and error)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from sessions_app.models import RunStatus
from sessions_app.services import runs
from tests.operator_ui.test_views import make
from tests.workers_app.test_placement_store import ENV, dispatch_to_active, make_session

pytestmark = pytest.mark.django_db


def finished(session, run_id: str, outcome: runs.TurnOutcome):
    runs.run_submit(session_key=session.key, message="hi", idempotency_key=run_id)
    run = runs.run_claim(run_id=run_id, executor="test").run
    runs.run_finish(run_id=run.run_id, outcome=outcome)
    return run


def test_runs_show_status_duration_and_error_and_filter_by_status(operator_client):
    session = make("agent:main:turns")
    ok = finished(session, "r-ok", runs.TurnOutcome(status=RunStatus.OK, text="fine", model="m1"))
    failed = finished(session, "r-bad", runs.TurnOutcome(status=RunStatus.ERROR, error="model exploded"))

    everything = operator_client.get(reverse("ui:runs")).content.decode()
    errors = operator_client.get(reverse("ui:runs"), {"status": "error"}).content.decode()
    unknown = operator_client.get(reverse("ui:runs"), {"status": "nonsense"})

    assert everything.index(failed.run_id) < everything.index(ok.run_id)  # newest first
    assert "model exploded" in everything and " ms</td>" in everything
    assert failed.run_id in errors and ok.run_id not in errors
    assert unknown.status_code == 200 and ok.run_id in unknown.content.decode()


def test_runs_page_in_one_query_for_the_rows(operator_client, django_assert_max_num_queries):
    session = make("agent:main:many")
    for index in range(3):
        finished(session, f"few-{index}", runs.TurnOutcome(status=RunStatus.OK, text="x"))
    with django_assert_max_num_queries(6) as few:
        operator_client.get(reverse("ui:runs"))
    for index in range(30):
        finished(session, f"many-{index}", runs.TurnOutcome(status=RunStatus.OK, text="x"))
    with django_assert_max_num_queries(len(few.captured_queries)):
        operator_client.get(reverse("ui:runs"))


def test_empty_pages_say_so(operator_client):
    assert "No turns yet." in operator_client.get(reverse("ui:runs")).content.decode()
    assert "No worker environments yet" in operator_client.get(reverse("ui:environments")).content.decode()


def test_environments_show_their_state_and_provider(operator_client):
    dispatch_to_active(make_session())

    page = operator_client.get(reverse("ui:environments")).content.decode()

    assert ENV in page and "attached" in page and "static-ssh / test" in page


def test_the_pages_need_a_login(client):
    for name in ("ui:runs", "ui:environments", "ui:nodes"):
        response = client.get(reverse(name))
        assert response.status_code == 302 and response["Location"].startswith(reverse("ui:login"))
