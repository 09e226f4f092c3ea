"""A session's actions in the console: stop a turn, dispatch, move back, stop the worker, recover a
failed placement. Each goes through the RPC's service; a placement that moved on since the page was
drawn is refused with the service's message and nothing changes."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from openclaw_site.gateway.models import AuditLog
from sessions_app.models import Run, RunStatus
from sessions_app.services import runs
from tests.operator_ui.test_views import make
from tests.workers_app.test_placement_store import ENV, dispatch_to_active, make_session
from tests.workers_app.test_rpc import failed_without_environment
from workers_app.models import Placement, PlacementState

pytestmark = pytest.mark.django_db
S = PlacementState


def act(client, session, name: str, data: dict | None = None):
    return client.post(reverse(f"ui:session-{name}", kwargs={"key": session.key}), data or {}, follow=True)


def messages_of(response) -> list[str]:
    return [message.message for message in get_messages(response.wsgi_request)]


def page_of(client, session) -> str:
    return client.get(reverse("ui:session", kwargs={"key": session.key})).content.decode()


def test_stopping_the_running_turn_is_audited_as_the_user(operator_client):
    session = make("agent:main:busy")
    runs.run_submit(session_key=session.key, message="long job", idempotency_key="busy-1")
    run = runs.run_claim(run_id="busy-1", executor="test").run
    assert "Stop the running turn" in page_of(operator_client, session)

    response = act(operator_client, session, "abort")

    assert messages_of(response) == ["Asked 1 turn(s) to stop."]
    assert Run.objects.get(pk=run.pk).abort_requested_at is not None
    assert AuditLog.objects.filter(action="session.run.abort", actor="user:ops").exists()


def test_stopping_when_nothing_runs_says_so(operator_client):
    session = make("agent:main:idle")

    assert messages_of(act(operator_client, session, "abort")) == ["No turn was running."]
    assert "Stop the running turn" not in page_of(operator_client, session)


def test_a_local_session_offers_a_dispatch_only_when_a_node_can_host_it(operator_client):
    session = make("agent:main:here")

    page = page_of(operator_client, session)
    refused = act(operator_client, session, "dispatch", {"target": ""})
    profile = act(operator_client, session, "dispatch", {"target": "profile:dev"})  # a plain operator

    assert "No connected session-host node to dispatch to." in page
    assert messages_of(refused) == ["choose a node or a profile to dispatch to"]
    assert messages_of(profile) == ["choose a node or a profile to dispatch to"]
    assert not Placement.objects.filter(pk=session.pk).exclude(state=S.LOCAL).exists()


def test_a_dispatch_to_a_node_that_cannot_host_is_the_services_refusal(operator_client):
    session = make("agent:main:nowhere")

    response = act(operator_client, session, "dispatch", {"target": "device:" + "a" * 64})

    assert messages_of(response) == ["device worker is not a paired node host: " + "a" * 64]
    assert not Placement.objects.filter(pk=session.pk).exclude(state=S.LOCAL).exists()


def test_an_active_placement_offers_move_back_and_stop_and_a_stale_page_is_refused(operator_client):
    session = make_session()
    active = dispatch_to_active(session)
    page = page_of(operator_client, session)
    assert "Move back to this gateway" in page and "Stop the worker" in page
    assert f'name="generation" value="{active.generation}"' in page

    stale = act(
        operator_client,
        session,
        "move-to-gateway",
        {"generation": active.generation - 1, "environmentId": ENV, "ownerEpoch": 1},
    )
    garbage = act(operator_client, session, "move-to-gateway", {"generation": "x", "ownerEpoch": "1"})

    assert messages_of(stale) == [f"Cannot move stale worker placement for session {session.session_id}"]
    assert messages_of(garbage) == ["the page's placement is out of date: reload it"]
    after = Placement.objects.get(pk=session.pk)
    assert (after.state, after.generation) == (S.ACTIVE, active.generation)


def test_a_failed_placement_is_recovered_for_the_generation_the_page_showed(operator_client):
    session = make_session()
    failed = failed_without_environment(session)
    page = page_of(operator_client, session)
    assert "Recover to this gateway" in page and "History of transitions" in page

    stale = act(operator_client, session, "reclaim", {"recoverGeneration": failed.generation + 1})
    assert Placement.objects.get(pk=session.pk).state == S.FAILED
    recovered = act(operator_client, session, "reclaim", {"recoverGeneration": failed.generation})

    assert messages_of(stale) == [
        f"Worker session placement {session.session_id} changed: "
        f"expected failed@{failed.generation + 1}, found failed@{failed.generation}"
    ]
    assert messages_of(recovered) == ["Placement is now local."]
    assert AuditLog.objects.filter(action="placement.recover_to_gateway", actor="user:ops").count() == 1


def test_actions_on_an_unknown_session_are_404(operator_client):
    response = operator_client.post(reverse("ui:session-abort", kwargs={"key": "agent:main:ghost"}))

    assert response.status_code == 404
    assert not Run.objects.filter(status=RunStatus.RUNNING).exists()
