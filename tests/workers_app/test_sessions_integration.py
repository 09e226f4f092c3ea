"""workers_app in sessions_app's seams: the placement projection on session rows, the dispatch
barrier on session actions, and the admin's placement and environment pages."""

from __future__ import annotations

import pytest
from django.urls import reverse

from gateway.exceptions import Unavailable
from gateway.scopes import ADMIN
from sessions_app import rpc, schemas
from sessions_app.models import Run, Session
from sessions_app.services import commands as chat_commands
from sessions_app.services import runs, sessions
from workers_app.models import Placement, PlacementMove, PlacementState, WorkerEnvironment
from workers_app.selectors import placement_fields
from workers_app.services import placements as store

from .test_placement_store import ENV, dispatch_to_active, make_session

pytestmark = pytest.mark.django_db

S = PlacementState


class Ctx:
    channel_name = ""


def describe(key: str) -> dict:
    return rpc.sessions_describe_rpc(Ctx(), schemas.SessionsDescribeParams(key=key))["session"]


def test_a_session_without_a_placement_has_no_placement_field():
    session = make_session()
    assert "placement" not in describe(session.key)


def test_describe_and_list_show_the_projection_of_each_state(django_assert_num_queries):
    active = make_session("agent:main:active")
    dispatch_to_active(active)
    requested = make_session("agent:main:requested")
    store.placement_start_dispatch(session=requested)
    make_session("agent:main:plain")

    shown = describe(active.key)["placement"]
    with django_assert_num_queries(3):  # the page, its placements, their environments
        listed = {row["key"]: row for row in rpc.sessions_list_rpc(Ctx(), schemas.SessionsListParams())["sessions"]}

    assert listed[active.key]["placement"] == shown
    assert shown["state"] == S.ACTIVE and shown["generation"] == 5
    assert shown["environmentId"] == ENV and shown["activeOwnerEpoch"] == 1
    assert (shown["providerId"], shown["profileId"]) == ("static-ssh", "test")  # the environment it owns
    assert not {"turnClaim", "sessionId", "agentId", "turn_claim_id"} & set(shown)
    assert listed["agent:main:requested"]["placement"] == {
        key: value
        for key, value in listed["agent:main:requested"]["placement"].items()
        if key in ("state", "generation", "createdAtMs", "updatedAtMs", "stateChangedAtMs")
    }
    assert listed["agent:main:requested"]["placement"]["state"] == S.REQUESTED
    assert "placement" not in listed["agent:main:plain"]


def test_a_failed_placement_shows_its_terminal_facts_and_recovery_action():
    gone = make_session("agent:main:gone")
    store.placement_start_dispatch(session=gone)
    store.placement_fail(session=gone, recovery_error="cloud worker disappeared: environment record missing")

    shown = describe(gone.key)["placement"]
    listed = {row["key"]: row for row in rpc.sessions_list_rpc(Ctx(), schemas.SessionsListParams())["sessions"]}

    # The page reads only the placement columns the projection declares: the same projection as describe's.
    assert listed[gone.key]["placement"] == shown
    assert shown["state"] == S.FAILED
    assert shown["terminalReason"] == shown["recoveryError"] == "cloud worker disappeared: environment record missing"
    assert isinstance(shown["terminalAtMs"], int)
    assert shown["recoveryAction"] == "restart"  # no environment holds a lease any more


@pytest.mark.parametrize("state_setup", ["requested", "draining"])
def test_the_dispatch_barrier_refuses_turns_resets_deletes_and_forks_and_writes_nothing(state_setup):
    session = make_session()
    if state_setup == "requested":
        store.placement_start_dispatch(session=session)
    else:
        placement = dispatch_to_active(session)
        store.placement_start_drain(
            session=session, environment_id=ENV, owner_epoch=1, expected_generation=placement.generation
        )
    before = Session.objects.filter(pk=session.pk).values().get()

    for attempt in (
        lambda: runs.chat_send(session_key=session.key, message="hi", idempotency_key="r1"),
        lambda: sessions.session_reset(key=session.key),
        lambda: sessions.session_delete(key=session.key),
    ):
        with pytest.raises(Unavailable) as refused:
            attempt()
        assert refused.value.details == {"code": "PLACEMENT_BARRIER", "placementState": state_setup}
        assert f"while its worker placement is {state_setup}" in refused.value.message
    assert not Run.objects.exists()
    assert Session.objects.filter(pk=session.pk).values().get() == before


def test_a_failed_placement_refuses_turns_with_its_reason():
    session = make_session()
    store.placement_start_dispatch(session=session)
    store.placement_fail(session=session, recovery_error="independent session failure")
    with pytest.raises(Unavailable, match=r"worker placement failed: independent session failure$"):
        runs.chat_send(session_key=session.key, message="hi", idempotency_key="r1")
    assert not Run.objects.exists()
    # Reset is still allowed: it is how an operator starts over on the gateway.
    assert sessions.session_reset(key=session.key).session_id != session.session_id


def test_the_admin_shows_placements_with_their_history_and_environments_with_their_error(admin_client):
    session = make_session()
    dispatch_to_active(session)
    WorkerEnvironment.objects.filter(pk=ENV).update(last_error="Worker provider no longer recognizes the lease")

    placements = admin_client.get(reverse("admin:workers_app_placement_changelist"))
    placement = admin_client.get(reverse("admin:workers_app_placement_change", args=[session.pk]))
    environments = admin_client.get(reverse("admin:workers_app_workerenvironment_changelist"))
    environment = admin_client.get(reverse("admin:workers_app_workerenvironment_change", args=[ENV]))

    assert placements.status_code == placement.status_code == 200
    assert environments.status_code == environment.status_code == 200
    page = placement.content.decode()
    for step in ("local → requested", "requested → provisioning", "starting → active"):
        assert step in page
    assert "Worker provider no longer recognizes the lease" in environments.content.decode()
    assert "ssh_key_ref" not in environment.content.decode()
    assert Placement.objects.get(pk=session.pk).state == S.ACTIVE  # inspection changed nothing


def test_the_admin_lists_moves_in_flight_with_their_error(admin_client, django_assert_max_num_queries):
    for n in range(3):
        session = make_session(f"agent:main:moving-{n}")
        PlacementMove.objects.create(
            operation_id=f"move:v1:{n}",
            session=session,
            source_generation=5,
            source_environment_id=f"worker:{n}",
            source_owner_epoch=1,
            target_kind="gateway",
            last_error="environment destroy: API down" if n == 0 else None,
            created_at_ms=1,
            updated_at_ms=1,
        )

    with django_assert_max_num_queries(8):  # not one per row
        page = admin_client.get(reverse("admin:workers_app_placementmove_changelist"))

    assert page.status_code == 200
    assert "environment destroy: API down" in page.content.decode()


def test_an_empty_page_asks_nothing_of_the_database(django_assert_num_queries):
    with django_assert_num_queries(0):
        assert placement_fields([]) == {}


def test_commands_in_chat_answer_while_a_placement_moves_and_a_reset_there_is_refused_with_the_barrier():
    """/status reports the placement in any state; /reset (which ends a running turn first) meets sessions.reset's
    barrier: the refusal is the reply, and the running turn, the transcript and the session are left as they were."""
    session = make_session()
    runs.run_submit(session_key=session.key, message="working", idempotency_key="t1")
    runs.run_claim(run_id="t1", executor="test")
    store.placement_start_dispatch(session=session)
    before = Session.objects.filter(pk=session.pk).values().get()

    status = chat_commands.chat_submit(session_key=session.key, message="/status", idempotency_key="c1", scopes=[ADMIN])
    reset = chat_commands.chat_submit(session_key=session.key, message="/reset", idempotency_key="c2", scopes=[ADMIN])

    assert "⚙️ Execution: placement requested" in status.run.output_text
    assert reset.run.output_text == (
        f"⚠️ Session {session.key} cannot reset while its worker placement is requested; retry when the move is done."
    )
    assert Run.objects.get(run_id="t1").status == "running"
    after = Session.objects.filter(pk=session.pk).values().get()
    assert (after["session_id"], after["lifecycle_revision"]) == (before["session_id"], before["lifecycle_revision"])
