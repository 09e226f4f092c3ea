"""The admin's actions ask a staff user for the scope the wire asks for the same work, besides Django's model
permissions: every action of every registered ModelAdmin is named in the table below (a new action without a row
fails here), each persona is offered exactly the actions its scopes allow, and an action posted without the scope
is refused and changes nothing. Saving an exec policy (``exec.approvals.set``) is an admin's, as on the wire."""

from __future__ import annotations

import json

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.test import RequestFactory
from django.urls import reverse

from approvals_app.models import ExecApprovalPolicy
from devices_app.models import DevicePairingRequest, PairingStatus
from devices_app.services import pairing
from gateway import scopes as sc
from gateway.models import AuditLog
from gateway.registry import registry
from tests.devices_app.test_services_pairing import claim
from tests.support.operators import grant, operator_user

pytestmark = pytest.mark.django_db

# (model label, action): the gateway method it does the work of, or the scope of work no method does.
ACTIONS = {
    ("sessions_app.session", "reset_sessions"): "sessions.reset",
    ("sessions_app.session", "clear_stuck_initializations"): sc.ADMIN,
    ("sessions_app.run", "abort_runs"): "chat.abort",
    ("workers_app.placement", "stop_workers"): "sessions.reclaim",
    ("workers_app.placement", "recover_to_gateway"): "sessions.reclaim",
    ("workers_app.placement", "fail_placements"): sc.ADMIN,
    ("workers_app.workerenvironment", "destroy_environments"): "environments.destroy",
    ("workers_app.workerenvironment", "retry_teardowns"): "environments.destroy",
    ("devices_app.paireddevice", "remove_devices"): "device.pair.remove",
    ("devices_app.paireddevice", "revoke_device_tokens"): "device.token.revoke",
    ("devices_app.devicepairingrequest", "approve_requests"): "device.pair.approve",
    ("devices_app.devicepairingrequest", "reject_requests"): "device.pair.reject",
    ("devices_app.devicetoken", "revoke_tokens"): "device.token.revoke",
    ("devices_app.devicetoken", "rotate_tokens"): "device.token.rotate",
    ("approvals_app.execapproval", "deny_pending"): "exec.approval.resolve",
}
PERSONAS = {
    "no scope": (),
    "read": (sc.READ,),
    "write": (sc.WRITE,),
    "pairing": (sc.PAIRING,),
    "approvals": (sc.APPROVALS,),
    "admin": (sc.ADMIN,),
}


def needed(what: str) -> str:
    return what if what.startswith("operator.") else registry.methods[what].scope


def registered_admins():
    """The project's ModelAdmins (Django's own, users and groups, are the auth app's)."""
    for model in apps.get_models():
        if admin.site.is_registered(model) and model._meta.app_label != "auth":
            yield model._meta.label_lower, admin.site.get_model_admin(model)


def staff_with_every_model_permission(username: str, *scopes: str):
    """Staff holding every model permission of the project's apps (view, change, delete): only the scopes differ."""
    user = operator_user(username, *scopes, is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label__in=["sessions_app", "workers_app", "devices_app", "approvals_app", "gateway"]
        ).exclude(codename__startswith="operator_")
    )
    return grant(user)


def offered(user) -> set[tuple[str, str]]:
    request = RequestFactory().get("/admin/")
    request.user = user
    return {(label, name) for label, model_admin in registered_admins() for name in model_admin.get_actions(request)}


def test_the_table_names_every_action_of_every_admin_and_each_declares_its_scope():
    declared = {}
    for label, model_admin in registered_admins():
        for name in model_admin.actions or ():
            action = getattr(model_admin, name)
            declared[(label, name)] = (action.operator_methods, action.operator_scope)

    assert sorted(declared) == sorted(ACTIONS)
    for key, (methods, scope) in declared.items():
        assert methods == (ACTIONS[key],) if scope is None else (methods, scope) == ((), ACTIONS[key]), key


def test_a_superuser_is_offered_every_action(admin_user):
    assert offered(admin_user) == set(ACTIONS)


@pytest.mark.parametrize("persona", list(PERSONAS))
def test_staff_are_offered_exactly_the_actions_their_scopes_allow(persona):
    scopes = PERSONAS[persona]
    user = staff_with_every_model_permission("staff", *scopes)

    expected = {key for key, what in ACTIONS.items() if sc.scope_satisfied(scopes, needed(what))}

    assert offered(user) == expected


def test_an_action_posted_without_its_scope_is_refused_and_changes_nothing(client, make_pairing_request):
    """The reported escalation, in the admin: approving a pairing request is ``operator.pairing``."""
    request = make_pairing_request(1)
    changelist = reverse("admin:devices_app_devicepairingrequest_changelist")
    writer = staff_with_every_model_permission("writer", sc.WRITE)
    client.force_login(writer)

    refused = client.post(changelist, {"action": "approve_requests", "_selected_action": [str(request.pk)]})

    # Not offered, so not run: the POST shows the list again.
    assert refused.status_code == 200 and "approve_requests" not in refused.content.decode()
    assert DevicePairingRequest.objects.get(pk=request.pk).status == PairingStatus.PENDING
    assert not AuditLog.objects.exists()

    grant(writer, sc.PAIRING)
    client.force_login(writer)
    done = client.post(changelist, {"action": "approve_requests", "_selected_action": [str(request.pk)]})

    assert [message.message for message in get_messages(done.wsgi_request)] == ["1 done, 0 skipped"]
    assert DevicePairingRequest.objects.get(pk=request.pk).status == PairingStatus.APPROVED
    assert AuditLog.objects.get().actor == "user:writer"


def test_pairing_alone_approves_no_node_that_would_run_commands(client):
    """The admin acts with the login's scopes, as the wire does with a token's: a node declaring ``system.run``
    needs ``operator.admin`` besides ``operator.pairing`` to be approved."""
    request, _created = pairing.pairing_request_ensure(claim=claim("e" * 64, commands=["system.run"]))
    client.force_login(staff_with_every_model_permission("pairer", sc.PAIRING))

    response = client.post(
        reverse("admin:devices_app_devicepairingrequest_changelist"),
        {"action": "approve_requests", "_selected_action": [str(request.pk)]},
    )

    assert [message.message for message in get_messages(response.wsgi_request)] == [
        f"0 done, 1 skipped: node request {str(request.request_id)[:8]} of {'e' * 12}: missing scope: operator.admin"
    ]
    assert DevicePairingRequest.objects.get(pk=request.pk).status == PairingStatus.PENDING


def test_saving_an_exec_policy_needs_operator_admin_as_exec_approvals_set_does(client):
    page = reverse("admin:approvals_app_execapprovalpolicy_add")
    document = {"scope": "gateway", "document_json": json.dumps({"version": 1, "defaults": {"security": "deny"}})}
    client.force_login(staff_with_every_model_permission("approver", sc.APPROVALS))

    refused = client.post(page, document)

    assert refused.status_code == 403 and not ExecApprovalPolicy.objects.exists()
    client.force_login(staff_with_every_model_permission("boss", sc.ADMIN))
    assert client.post(page, document).status_code == 302
    assert ExecApprovalPolicy.objects.get(scope="gateway").document["defaults"] == {"security": "deny"}
