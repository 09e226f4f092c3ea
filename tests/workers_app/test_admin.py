"""workers_app admin as a recovery console: the placement and environment actions call the RPCs' services,
refuse with the service's own message when the state moved on (changing nothing), and write an audit row
naming the Django user, with the state before and after."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.urls import reverse

from openclaw_site.gateway.models import AuditLog
from tests.workers_app.test_placement_store import ENV, attached_environment, dispatch_to_active, make_session
from tests.workers_app.test_rpc import failed_without_environment
from workers_app.models import Placement, PlacementState, WorkerEnvironment

S = PlacementState


@pytest.fixture
def admin_user_client(client, django_user_model):
    user = django_user_model.objects.create_superuser(username="root", password="a-long-enough-password")
    client.force_login(user)
    return client


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
