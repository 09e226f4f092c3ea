"""A session's actions in the console: stop a turn, dispatch, move back, stop the worker, recover a
failed placement. Each goes through the RPC's service; a placement that moved on since the page was
drawn is refused with the service's message and nothing changes."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from gateway import scopes as sc
from gateway.audit import Actor
from gateway.models import AuditLog
from sessions_app.models import Run, RunStatus
from sessions_app.services import runs
from tests.operator_ui.test_views import make
from tests.support.operators import operator_user
from tests.workers_app.test_placement_store import DISPATCH_STEPS, ENV, dispatch_to_active, make_session, walk
from tests.workers_app.test_rpc import dev_profile, failed_without_environment, use_profiles  # noqa: F401 (fixtures)
from workers_app.models import Placement, PlacementHistory, PlacementState
from workers_app.services import dispatch, reclaim
from workers_app.services import placements as store

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


# --- the dispatch's stages on the placement card ----------------------------------------------------

STAGE = re.compile(
    r'<li class="stage stage-(?P<status>\w+)"[^>]*>.*?<span class="name">(?P<name>[^<]+)</span>'
    r'(?:(?!</li>).)*?(?:<div class="error">(?P<reason>[^<]*)</div>)?\s*</li>',
    re.S,
)
NAMES = {
    "Requested": S.REQUESTED,
    "Provisioning the environment": S.PROVISIONING,
    "Syncing the workspace": S.SYNCING,
    "Starting the worker": S.STARTING,
    "Active on the worker": S.ACTIVE,
}


def stages_of(page: str) -> list[tuple[str, str, str]]:
    """The placement card's stage list as (stage, status, failure reason) rows."""
    region = page.split('data-live-region="placement"', 1)[1].split('data-live-region="runs"', 1)[0]
    return [(NAMES[m["name"]], m["status"], html.unescape(m["reason"] or "")) for m in STAGE.finditer(region)]


def expected(done: int, then: str = "", reason: str = "") -> list[tuple[str, str, str]]:
    """The first ``done`` stages done, the next one ``then`` (with its reason), the rest pending."""
    order = [S.REQUESTED, S.PROVISIONING, S.SYNCING, S.STARTING, S.ACTIVE]
    rows = [(state, "done", "") for state in order[:done]]
    if then:
        rows.append((order[done], then, reason))
    return rows + [(state, "pending", "") for state in order[len(rows) :]]


@pytest.mark.parametrize("steps", [0, 1, 2, 3])
def test_a_dispatch_under_way_shows_its_stages_done_current_and_pending(operator_client, steps):
    session = make_session()
    placement = walk(session, DISPATCH_STEPS[:steps])
    page = page_of(operator_client, session)

    assert placement.state == [S.REQUESTED, S.PROVISIONING, S.SYNCING, S.STARTING][steps]
    assert stages_of(page) == expected(steps, "current")
    assert page.count('aria-current="step"') == 1
    assert f"Dispatch in progress: {placement.state}." in page


def test_an_active_placement_shows_every_stage_done(operator_client):
    session = make_session()
    dispatch_to_active(session)

    page = page_of(operator_client, session)

    assert stages_of(page) == expected(5)
    assert 'aria-current="step"' not in page


STAGE_TIME = re.compile(r'<time datetime="(?P<iso>[^"]+)"')


def iso_second(at_ms: int) -> str:
    return datetime.fromtimestamp(at_ms // 1000, tz=UTC).isoformat()


def test_each_stage_shows_when_it_started_and_a_pending_stage_shows_no_time(operator_client, monkeypatch):
    ticks = iter(range(1_780_000_000_000, 1_780_000_100_000, 2500))
    monkeypatch.setattr(store, "now_ms", lambda: next(ticks))
    session = make_session()
    walk(session, DISPATCH_STEPS[:1])  # requested, then provisioning 2.5 s later

    page = page_of(operator_client, session)

    stage_items = re.findall(r'<li class="stage stage-\w+".*?</li>', page, re.S)
    times = [[m["iso"] for m in STAGE_TIME.finditer(item)] for item in stage_items]
    entered = dict(
        PlacementHistory.objects.filter(session=session, to_state__in=[S.REQUESTED, S.PROVISIONING]).values_list(
            "to_state", "at_ms"
        )
    )
    assert entered[S.PROVISIONING] - entered[S.REQUESTED] == 2500
    assert times == [[iso_second(entered[S.REQUESTED])], [iso_second(entered[S.PROVISIONING])], [], [], []]
    assert "2.5 s after the request" in stage_items[1]
    assert "after the request" not in stage_items[0]


@pytest.mark.parametrize("steps", [0, 1, 3])
def test_a_dispatch_failed_in_a_stage_shows_that_stage_failed_with_the_terminal_reason(operator_client, steps):
    session = make_session()
    walk(session, DISPATCH_STEPS[:steps])
    stage = [S.REQUESTED, S.PROVISIONING, S.SYNCING, S.STARTING][steps]
    reason = f"Worker dispatch failed in {stage}: static-ssh needs host <&>"
    store.placement_fail(session=session, recovery_error=reason)

    page = page_of(operator_client, session)

    assert stages_of(page) == expected(steps, "failed", reason)
    assert f"<dt>Terminal reason</dt><dd>{html.escape(reason)}</dd>" in page
    assert f"Dispatch failed in {stage}." in page


def test_a_worker_that_failed_after_it_took_over_shows_its_active_stage_failed(operator_client):
    session = make_session()
    active = dispatch_to_active(session)
    store.placement_fail_owned(
        session=session,
        environment_id=ENV,
        owner_epoch=1,
        expected_generation=active.generation,
        recovery_error="cloud worker disappeared: environment state orphaned",
    )

    assert stages_of(page_of(operator_client, session)) == expected(
        4, "failed", "cloud worker disappeared: environment state orphaned"
    )


def test_a_redispatch_shows_only_its_own_stages(operator_client):
    session = make_session()
    failed_without_environment(session)
    store.placement_start_dispatch(session=session)  # failed → requested: a second dispatch

    assert stages_of(page_of(operator_client, session)) == expected(0, "current")


def test_no_stages_show_without_a_dispatch_behind_the_placement(operator_client):
    never = make("agent:main:never")
    stopped = make_session("agent:main:stopped")
    failed_without_environment(stopped)
    reclaim.reclaim(session=stopped, recover_to_gateway_generation=None, actor=Actor.system())  # failed → local

    for session in (never, stopped):
        page = page_of(operator_client, session)
        assert stages_of(page) == [] and "Dispatch stages" not in page
        assert '<p class="visually-hidden" aria-live="polite" data-live-region="dispatch-status"></p>' in page


@pytest.mark.usefixtures("dev_profile")
def test_a_staff_dispatch_to_a_profile_shows_its_stages_until_it_fails(client, django_user_model):
    client.force_login(operator_user("boss", sc.ADMIN, is_staff=True))
    session = make("agent:main:to-profile")
    assert '<option value="profile:dev">profile dev</option>' in page_of(client, session)

    started = act(client, session, "dispatch", {"target": "profile:dev"})

    assert messages_of(started) == ["Dispatch started: its stages show in the placement card."]
    assert stages_of(started.content.decode()) == expected(1, "current")
    placement = Placement.objects.get(pk=session.pk)
    # The dispatch's task (run here: on_commit callbacks do not run in this test's transaction).
    assert dispatch.dispatch_advance(session_pk=session.pk, generation=placement.generation) == S.FAILED
    failed = Placement.objects.get(pk=session.pk)
    assert failed.terminal_reason.startswith("Worker dispatch failed in provisioning: ")
    assert stages_of(page_of(client, session)) == expected(1, "failed", failed.terminal_reason)


@pytest.mark.usefixtures("dev_profile")
def test_a_plain_operator_cannot_dispatch_to_a_profile(operator_client):
    session = make("agent:main:not-staff")
    assert "profile:dev" not in page_of(operator_client, session)

    response = act(operator_client, session, "dispatch", {"target": "profile:dev"})

    assert messages_of(response) == ["choose a node or a profile to dispatch to"]
    assert not Placement.objects.filter(pk=session.pk).exclude(state=S.LOCAL).exists()


# --- the stop button follows the turn ---------------------------------------------------------------


def abort_region_of(page: str) -> str:
    return page.split('<div data-live-region="abort">', 1)[1].split("</div>", 1)[0]


def test_the_stop_button_lives_in_a_live_region_that_empties_when_the_turn_ends(operator_client):
    session = make("agent:main:ending")
    runs.run_submit(session_key=session.key, message="job", idempotency_key="ending-1")
    runs.run_claim(run_id="ending-1", executor="test")
    assert "Stop the running turn" in abort_region_of(page_of(operator_client, session))

    runs.run_finish(run_id="ending-1", outcome=runs.TurnOutcome(status="ok", text="done"))

    # What the page's script fetches when the turn's end arrives on its socket.
    refreshed = operator_client.get(
        reverse("ui:session", kwargs={"key": session.key}), headers={"X-Requested-With": "console"}
    ).content.decode()
    assert abort_region_of(refreshed).strip() == ""


def test_a_move_back_under_way_shows_the_dispatch_it_ends_as_completed(operator_client):
    session = make_session()
    active = dispatch_to_active(session)
    store.placement_start_drain(
        session=session, environment_id=ENV, owner_epoch=1, expected_generation=active.generation
    )

    assert stages_of(page_of(operator_client, session)) == expected(5)
