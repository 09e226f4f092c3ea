"""workers_app admin as a recovery console: the placement and environment actions call the RPCs' services,
refuse with the service's own message when the state moved on (changing nothing), and write an audit row
naming the Django user, with the state before and after."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils.html import escape

from gateway.admin.common import audit_history_url
from gateway.audit import Actor
from gateway.models import AuditLog
from tests.workers_app.test_placement_store import (
    ENV,
    attached_environment,
    dispatch_to_active,
    dispatch_to_active_on,
    make_session,
)
from tests.workers_app.test_recovery import ScriptedProvider, on_scripted
from tests.workers_app.test_rpc import failed_without_environment
from workers_app.models import Placement, PlacementHistory, PlacementState, WorkerEnvironment
from workers_app.providers import WorkerProviderError, providers
from workers_app.services import reclaim

S = PlacementState


@pytest.fixture
def admin_user_client(client, django_user_model):
    user = django_user_model.objects.create_superuser(username="root", password="a-long-enough-password")
    client.force_login(user)
    return client


@pytest.fixture
def scripted():
    """A provider whose answers the test sets, registered the way any app registers one."""
    provider = ScriptedProvider()
    providers.register(provider)
    yield provider
    providers.unregister(provider.id)


def run_action(client, model, action: str, objects):
    url = reverse(f"admin:workers_app_{model._meta.model_name}_changelist")
    return client.post(url, {"action": action, "_selected_action": [str(o.pk) for o in objects], "index": 0})


def messages_of(response) -> list[str]:
    return [message.message for message in get_messages(response.wsgi_request)]


@pytest.mark.django_db
def test_recovering_a_failed_placement_to_the_gateway_is_audited_with_the_user(admin_user_client):
    session = make_session()
    failed = failed_without_environment(session)

    response = run_action(admin_user_client, Placement, "recover_to_gateway", [failed])

    assert messages_of(response) == ["1 done, 0 skipped"]
    placement = Placement.objects.get(pk=session.pk)
    assert placement.state == S.LOCAL
    [row] = AuditLog.objects.filter(action="placement.recover_to_gateway")
    assert (row.actor, row.actor_user.username, row.target_type, row.target_id) == (
        "user:root",
        "root",
        "session",
        session.key,
    )
    assert row.data["before"] == f"failed@{failed.generation}"
    assert row.data["after"] == f"local@{placement.generation}"
    assert LogEntry.objects.filter(object_id=str(session.pk)).exists()  # Django's history of the object too


@pytest.mark.django_db
def test_an_action_on_a_placement_whose_state_moved_on_shows_the_services_refusal_and_changes_nothing(
    admin_user_client,
):
    session = make_session()
    active = dispatch_to_active(session)

    response = run_action(admin_user_client, Placement, "recover_to_gateway", [active])

    expected = (
        f"Worker session placement {session.session_id} changed: "
        f"expected failed@{active.generation}, found active@{active.generation}"
    )
    assert messages_of(response) == [f"0 done, 1 skipped: {session.key} (active@{active.generation}): {expected}"]
    assert Placement.objects.get(pk=session.pk).generation == active.generation
    assert not AuditLog.objects.exists()


@pytest.mark.django_db
def test_destroying_an_environment_a_session_holds_is_refused_with_the_services_message(admin_user_client):
    session = make_session()
    dispatch_to_active(session)
    environment = WorkerEnvironment.objects.get(pk=ENV)

    response = run_action(admin_user_client, WorkerEnvironment, "destroy_environments", [environment])

    message = f"worker environment {ENV} is attached to a session; stop its cloud worker first or destroy with force"
    assert messages_of(response) == [f"0 done, 1 skipped: {ENV}: {message}"]
    assert WorkerEnvironment.objects.get(pk=ENV).state == "attached"
    assert not AuditLog.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_destroying_a_free_environment_is_audited_with_its_states(admin_user_client):
    session = make_session()
    attached_environment(session)  # leased, but no placement owns it any more
    environment = WorkerEnvironment.objects.get(pk=ENV)

    response = run_action(admin_user_client, WorkerEnvironment, "destroy_environments", [environment])

    assert messages_of(response) == ["1 done, 0 skipped"]
    assert WorkerEnvironment.objects.get(pk=ENV).state == "destroyed"
    [row] = AuditLog.objects.filter(action="environment.destroy", target_id=ENV)
    assert row.actor_user.username == "root"
    assert row.data == {"before": "attached", "after": "destroyed", "force": False}


@pytest.mark.django_db
def test_the_audit_trail_is_filterable_by_object(admin_user_client):
    session = make_session()
    other = make_session("agent:main:other")
    for placed in (session, other):
        run_action(admin_user_client, Placement, "recover_to_gateway", [failed_without_environment(placed)])

    listed = admin_user_client.get(reverse("admin:gateway_auditlog_changelist"), {"target_id": session.key})

    assert listed.status_code == 200
    page = listed.content.decode()
    assert "placement.recover_to_gateway" in page
    assert session.key in page and other.key not in page


@pytest.mark.django_db
def test_placement_and_environment_pages_stay_read_only(admin_user_client):
    session = make_session()
    placement = dispatch_to_active(session)

    change = admin_user_client.post(
        reverse("admin:workers_app_placement_change", args=[placement.pk]), {"state": "local"}
    )

    assert change.status_code in (200, 403)
    assert Placement.objects.get(pk=session.pk).state == S.ACTIVE
    assert admin_user_client.get(reverse("admin:workers_app_workerenvironment_add")).status_code == 403


# --- failing a placement ----------------------------------------------------------------------


def confirm_and_run(client, model, action: str, objects, **extra):
    """The action's second POST, as its confirmation page sends it."""
    url = reverse(f"admin:workers_app_{model._meta.model_name}_changelist")
    data = {"action": action, "_selected_action": [str(o.pk) for o in objects], "post": "yes", **extra}
    return client.post(url, data)


@pytest.mark.django_db
def test_failing_a_placement_asks_first_and_changes_nothing_until_confirmed(admin_user_client, scripted):
    session = make_session()
    active = on_scripted(session)

    response = run_action(admin_user_client, Placement, "fail_placements", [active])

    assert response.status_code == 200
    assert "admin/action_confirmation.html" in [t.name for t in response.templates]
    page = response.content.decode()
    assert f'name="expected-{session.pk}" value="active@{active.generation}"' in page
    assert 'name="post" value="yes"' in page and reclaim.FAILED_BY_OPERATOR in page
    assert Placement.objects.get(pk=session.pk).state == S.ACTIVE
    assert not AuditLog.objects.exists() and not scripted.destroyed


@pytest.mark.django_db
def test_failing_an_active_placement_gives_its_worker_up_and_is_audited(admin_user_client, scripted):
    session = make_session()
    active = on_scripted(session)

    response = confirm_and_run(
        admin_user_client,
        Placement,
        "fail_placements",
        [active],
        **{f"expected-{session.pk}": f"active@{active.generation}"},
    )

    assert messages_of(response) == ["1 done, 0 skipped"]
    placement = Placement.objects.get(pk=session.pk)
    assert (placement.state, placement.terminal_reason) == (S.FAILED, reclaim.FAILED_BY_OPERATOR)
    assert scripted.destroyed == [f"static-ssh:{ENV}"]
    assert WorkerEnvironment.objects.get(pk=ENV).state == "failed"
    [row] = AuditLog.objects.filter(action="placement.fail")
    assert (row.actor, row.actor_user.username, row.target_type, row.target_id) == (
        "user:root",
        "root",
        "session",
        session.key,
    )
    assert row.data == {
        "before": f"active@{active.generation}",
        "after": f"failed@{placement.generation}",
        "environmentId": ENV,
        "reason": reclaim.FAILED_BY_OPERATOR,
    }
    history = LogEntry.objects.get(object_id=str(session.pk))
    assert history.change_message.startswith(f"Failed via admin action: active@{active.generation} -> failed@")


@pytest.mark.django_db
def test_failing_a_placement_that_moved_on_since_the_confirmation_shows_the_services_refusal(
    admin_user_client, scripted
):
    session = make_session()
    active = on_scripted(session)
    generation_then = active.generation - 1  # the confirmation page showed it still starting

    response = confirm_and_run(
        admin_user_client,
        Placement,
        "fail_placements",
        [active],
        **{f"expected-{session.pk}": f"starting@{generation_then}"},
    )

    expected = (
        f"Worker session placement {session.session_id} changed: "
        f"expected starting@{generation_then}, found active@{active.generation}"
    )
    assert messages_of(response) == [f"0 done, 1 skipped: {session.key} (active@{active.generation}): {expected}"]
    assert Placement.objects.get(pk=session.pk).state == S.ACTIVE
    assert not scripted.destroyed
    assert not AuditLog.objects.exists() and not LogEntry.objects.exists()


@pytest.mark.django_db
def test_a_failed_placement_cannot_be_failed_again(admin_user_client):
    session = make_session()
    failed = failed_without_environment(session)

    response = confirm_and_run(
        admin_user_client,
        Placement,
        "fail_placements",
        [failed],
        **{f"expected-{session.pk}": f"failed@{failed.generation}"},
    )

    assert messages_of(response) == [
        f"0 done, 1 skipped: {session.key} (failed@{failed.generation}): "
        "Cannot fail worker session placement from failed"
    ]
    assert Placement.objects.get(pk=session.pk).terminal_reason == failed.terminal_reason
    assert not AuditLog.objects.exists()


# --- retrying a teardown ------------------------------------------------------------------------


def pending_teardown(scripted, session) -> WorkerEnvironment:
    """A worker given up whose provider failed to release it: its teardown waits for a retry."""
    scripted.destroy_error = WorkerProviderError("API down")
    on_scripted(session)
    reclaim.placement_force_fail(
        session=session,
        expected_state=S.ACTIVE,
        expected_generation=Placement.objects.get(pk=session.pk).generation,
        actor=Actor.system("cli"),
    )
    environment = WorkerEnvironment.objects.get(pk=ENV)
    assert environment.destroy_requested_at_ms is not None and environment.state == "attached"
    return environment


@pytest.mark.django_db
def test_retrying_a_teardown_that_fails_again_shows_the_services_error(admin_user_client, scripted):
    environment = pending_teardown(scripted, make_session())
    audit_rows = AuditLog.objects.count()

    response = run_action(admin_user_client, WorkerEnvironment, "retry_teardowns", [environment])

    assert messages_of(response) == [
        f"0 done, 1 skipped: {ENV}: Worker environment teardown failed: environment destroy: API down"
    ]
    assert WorkerEnvironment.objects.get(pk=ENV).state == "attached"
    assert AuditLog.objects.count() == audit_rows


@pytest.mark.django_db
def test_retrying_a_teardown_once_the_provider_answers_finishes_it_and_is_audited(admin_user_client, scripted):
    environment = pending_teardown(scripted, make_session())
    scripted.destroy_error = None

    response = run_action(admin_user_client, WorkerEnvironment, "retry_teardowns", [environment])

    assert messages_of(response) == ["1 done, 0 skipped"]
    assert WorkerEnvironment.objects.get(pk=ENV).state == "failed"  # the first cause of the teardown wins
    [row] = AuditLog.objects.filter(action="environment.destroy", actor="user:root")
    assert row.data == {"before": "attached", "after": "failed", "force": False}
    listed = admin_user_client.get(reverse("admin:workers_app_workerenvironment_changelist"), {"teardown": "pending"})
    assert list(listed.context["cl"].result_list) == []


@pytest.mark.django_db
def test_retrying_a_teardown_skips_environments_without_one_pending(admin_user_client):
    session = make_session()
    live = attached_environment(session)
    gone = attached_environment(session, environment_id="worker:gone")
    WorkerEnvironment.objects.filter(pk=gone.pk).update(state="failed", lease_id=None, attached_session_ids=[])

    response = run_action(admin_user_client, WorkerEnvironment, "retry_teardowns", [live, gone])

    [message] = messages_of(response)
    assert message.startswith("0 done, 2 skipped: ")
    assert f"{ENV}: no teardown pending" in message and "worker:gone: already failed" in message
    assert WorkerEnvironment.objects.get(pk=ENV).state == "attached"
    assert not AuditLog.objects.exists()


# --- inspection at size, and each object's audit history ----------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("model", [Placement, PlacementHistory, WorkerEnvironment], ids=lambda m: m.__name__)
def test_changelists_have_no_n_plus_one(admin_user_client, django_assert_max_num_queries, model):
    for n in range(25):
        session = make_session(f"agent:main:s{n}")
        dispatch_to_active_on(session, f"worker:env-{n}")

    # Django session, user, the count (+ the planner estimate on PostgreSQL), the page, the filters'
    # value lists: none of it per row.
    with django_assert_max_num_queries(9):
        response = admin_user_client.get(reverse(f"admin:workers_app_{model._meta.model_name}_changelist"))

    assert response.status_code == 200
    assert len(response.context["cl"].result_list) >= 25


@pytest.mark.django_db
def test_placement_and_environment_pages_link_their_audit_history(admin_user_client):
    session = make_session()
    failed = failed_without_environment(session)
    run_action(admin_user_client, Placement, "recover_to_gateway", [failed])
    attached_environment(session)

    placement_page = admin_user_client.get(reverse("admin:workers_app_placement_change", args=[session.pk]))
    environment_page = admin_user_client.get(reverse("admin:workers_app_workerenvironment_change", args=[ENV]))

    history_url = audit_history_url(session.key, "session")
    assert escape(history_url) in placement_page.content.decode()
    assert escape(audit_history_url(ENV, "environment")) in environment_page.content.decode()
    listed = admin_user_client.get(history_url)
    assert [row.action for row in listed.context["cl"].result_list] == ["placement.recover_to_gateway"]
    assert f"Audit history of session {session.key}" in listed.content.decode()
