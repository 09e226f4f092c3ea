from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from devices_app.models import DevicePairingRequest, DeviceToken, PairedDevice, PairingStatus
from devices_app.services import pairing, tokens
from gateway import scopes as sc
from gateway.admin.common import audit_history_url
from gateway.audit import Actor, audit
from gateway.auth import hash_device_token
from gateway.exceptions import InvalidRequest
from gateway.models import AuditLog, GatewayConnection, GatewayProcess
from tests.support.operators import operator_user

pytestmark = pytest.mark.django_db

MODELS = [PairedDevice, DevicePairingRequest, DeviceToken, GatewayConnection, GatewayProcess, AuditLog]
PROTOCOL_MODELS = [DevicePairingRequest, DeviceToken, GatewayConnection, GatewayProcess, AuditLog]


def admin_url(model, view: str, *args) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def messages_of(response) -> list[str]:
    return [m.message for m in get_messages(response.wsgi_request)]


def run_action(client, model, action: str, objects, **extra):
    data = {"action": action, "_selected_action": [str(o.pk) for o in objects], **extra}
    return client.post(admin_url(model, "changelist"), data)


@pytest.fixture
def populated(make_device, make_token, make_connection, make_pairing_request):
    """One row of every model, including an audit row written by a service."""
    device = make_device(1)
    token = make_token(device)
    make_connection(device)
    request = make_pairing_request(2)
    pairing.pairing_request_reject(request_id=str(request.request_id), actor=Actor.system("cli"))
    make_pairing_request(3)
    return device, token


# --- rendering and inspection ---------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_it_renders_the_changelist(admin_client, populated, model):
    response = admin_client.get(admin_url(model, "changelist"))

    assert response.status_code == 200
    assert response.context["cl"].result_count >= 1


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_it_renders_objects_read_only(admin_client, populated, model):
    obj = model.objects.first()

    response = admin_client.get(admin_url(model, "change", obj.pk))

    assert response.status_code == 200
    assert response.context["has_change_permission"] is False
    assert 'name="_save"' not in response.content.decode()


@pytest.mark.parametrize(
    ("model", "query"),
    [
        (PairedDevice, "role=node&connected=yes"),
        (PairedDevice, "q=Device+1"),
        (DevicePairingRequest, "state=open&role=operator"),
        (DevicePairingRequest, "state=overdue"),
        (DevicePairingRequest, "state=rejected"),
        (DeviceToken, "state=active&role=operator"),
        (GatewayConnection, "alive=yes&role=operator"),
        (GatewayProcess, "alive=no"),
        (AuditLog, "action__exact=device.pair.reject"),
    ],
)
def test_it_filters_and_searches(admin_client, populated, model, query):
    response = admin_client.get(admin_url(model, "changelist") + "?" + query)

    # An invalid filter or lookup would redirect to ?e=1 instead.
    assert response.status_code == 200


def test_it_searches_pairing_requests_by_request_id(admin_client, make_pairing_request):
    request = make_pairing_request(1)
    make_pairing_request(2)

    response = admin_client.get(admin_url(DevicePairingRequest, "changelist"), {"q": str(request.request_id)})

    assert response.status_code == 200
    assert [r.pk for r in response.context["cl"].result_list] == [request.pk]


def test_role_filter_matches_list_elements(admin_client, make_device):
    operator = make_device(1, roles=[sc.ROLE_OPERATOR])
    both = make_device(2, roles=[sc.ROLE_NODE, sc.ROLE_OPERATOR])

    nodes = admin_client.get(admin_url(PairedDevice, "changelist"), {"role": "node"})
    operators = admin_client.get(admin_url(PairedDevice, "changelist"), {"role": "operator"})

    assert {d.pk for d in nodes.context["cl"].result_list} == {both.pk}
    assert {d.pk for d in operators.context["cl"].result_list} == {operator.pk, both.pk}


def test_device_changelist_shows_connection_and_token_state(admin_client, make_device, make_token, make_connection):
    online = make_device(1)
    make_token(online)
    make_token(online, sc.ROLE_NODE, revoked=True)
    make_connection(online)
    make_device(2)

    response = admin_client.get(admin_url(PairedDevice, "changelist"), {"connected": "yes"})

    assert response.status_code == 200
    [row] = response.context["cl"].result_list
    assert row.pk == online.pk
    assert row.connected is True
    assert row.active_token_count == 1


def test_device_changelist_has_no_n_plus_one(
    admin_client, django_assert_max_num_queries, make_device, make_token, make_connection
):
    for n in range(20):
        device = make_device(n, roles=[sc.ROLE_NODE, sc.ROLE_OPERATOR])
        make_token(device)
        make_token(device, sc.ROLE_NODE)
        make_connection(device)

    # session, user, two counts, the page, and the filter lookups: none of it per row.
    with django_assert_max_num_queries(10):
        response = admin_client.get(admin_url(PairedDevice, "changelist"))

    assert response.status_code == 200
    assert len(response.context["cl"].result_list) == 20


@pytest.mark.parametrize("model", [DeviceToken, GatewayConnection, AuditLog], ids=lambda m: m.__name__)
def test_related_columns_have_no_n_plus_one(
    admin_client, admin_user, django_assert_max_num_queries, make_device, make_token, make_connection, model
):
    for n in range(20):
        device = make_device(n)
        make_token(device)
        make_connection(device)
        audit(Actor.for_user(admin_user), "node.rename", "node", device.device_id)

    with django_assert_max_num_queries(10):
        response = admin_client.get(admin_url(model, "changelist"))

    assert response.status_code == 200
    assert len(response.context["cl"].result_list) >= 20


def test_token_hash_never_appears_in_admin_pages(admin_client, make_device, make_token, make_connection):
    device = make_device(1)
    token = make_token(device)
    make_connection(device)
    # History and audit pages must also stay clean after an action touched the token.
    assert run_action(admin_client, DeviceToken, "revoke_tokens", [token], index=0).status_code == 302
    token.refresh_from_db()
    pages = [
        admin_url(DeviceToken, "changelist"),
        admin_url(DeviceToken, "changelist") + "?state=revoked",
        admin_url(DeviceToken, "change", token.pk),
        admin_url(DeviceToken, "history", token.pk),
        admin_url(PairedDevice, "changelist"),
        admin_url(PairedDevice, "change", device.pk),
        admin_url(AuditLog, "changelist"),
        admin_url(AuditLog, "change", AuditLog.objects.get().pk),
    ]

    for page in pages:
        response = admin_client.get(page)
        assert response.status_code == 200, page
        content = response.content.decode()
        assert device.device_id[:12] in content, page
        assert token.token_hash not in content, page
    confirmation = run_action(admin_client, PairedDevice, "remove_devices", [device], index=0)
    assert confirmation.status_code == 200
    assert token.token_hash not in confirmation.content.decode()


def test_token_hash_is_not_searchable_or_in_forms(admin_client, make_device, make_token):
    token = make_token(make_device(1))

    response = admin_client.get(admin_url(DeviceToken, "changelist"), {"q": token.token_hash})

    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == []
    token_admin = response.context["cl"].model_admin
    request = response.wsgi_request
    assert "token_hash" not in token_admin.get_fields(request, token)
    assert "token_hash" not in token_admin.get_readonly_fields(request, token)
    assert "token_hash" not in token_admin.get_list_display(request)


@pytest.mark.parametrize("model", [*PROTOCOL_MODELS, PairedDevice], ids=lambda m: m.__name__)
def test_protocol_rows_cannot_be_added_or_deleted(admin_client, populated, model):
    obj = model.objects.first()

    add = admin_client.get(admin_url(model, "add"))
    delete = admin_client.post(admin_url(model, "delete", obj.pk), {"post": "yes"})

    assert add.status_code == 403
    assert delete.status_code == 403
    assert model.objects.filter(pk=obj.pk).exists()


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_change_form_does_not_save(admin_client, populated, model):
    obj = model.objects.first()

    response = admin_client.post(admin_url(model, "change", obj.pk), {"_save": "Save"})

    assert response.status_code == 403


def test_live_state_and_audit_log_offer_no_actions(admin_client, populated):
    for model in (GatewayConnection, GatewayProcess, AuditLog):
        response = admin_client.get(admin_url(model, "changelist"))
        assert response.status_code == 200
        assert response.context["action_form"] is None


# --- pairing request actions ----------------------------------------------------------------


def test_approve_pairs_the_device_and_audits_the_user(admin_client, admin_user, make_pairing_request):
    request = make_pairing_request(1, scopes=[sc.READ, sc.WRITE])

    response = run_action(admin_client, DevicePairingRequest, "approve_requests", [request], index=0)

    assert response.status_code == 302
    assert messages_of(response) == ["1 done, 0 skipped"]
    request.refresh_from_db()
    assert request.status == PairingStatus.APPROVED
    assert request.resolved_by == "user:admin"
    device = PairedDevice.objects.get(device_id=request.device_id)
    assert device.roles == [sc.ROLE_OPERATOR]
    assert device.approved_scopes == [sc.READ, sc.WRITE]
    audit = AuditLog.objects.get(action="device.pair.approve")
    assert audit.actor == "user:admin"
    assert audit.actor_user == admin_user
    assert audit.target_id == request.device_id
    assert audit.data["requestId"] == str(request.request_id)
    history = LogEntry.objects.get(object_id=str(request.pk))
    assert history.action_flag == CHANGE
    assert history.user == admin_user
    assert "Approved via admin action" in history.change_message


def test_reject_resolves_the_request_without_pairing(admin_client, admin_user, make_pairing_request):
    request = make_pairing_request(1)

    response = run_action(admin_client, DevicePairingRequest, "reject_requests", [request], index=0)

    assert response.status_code == 302
    assert messages_of(response) == ["1 done, 0 skipped"]
    request.refresh_from_db()
    assert request.status == PairingStatus.REJECTED
    assert request.resolved_by == "user:admin"
    assert not PairedDevice.objects.exists()
    audit = AuditLog.objects.get()
    assert (audit.action, audit.actor, audit.actor_user) == ("device.pair.reject", "user:admin", admin_user)
    assert LogEntry.objects.get(object_id=str(request.pk)).change_message == "Rejected via admin action."


@pytest.mark.parametrize("action", ["approve_requests", "reject_requests"])
def test_non_pending_request_is_skipped_with_reason(admin_client, make_pairing_request, action):
    request = make_pairing_request(1)
    pairing.pairing_request_reject(request_id=str(request.request_id), actor=Actor.system("cli"))
    request.refresh_from_db()
    audit_rows = AuditLog.objects.count()

    response = run_action(admin_client, DevicePairingRequest, action, [request], index=0)

    assert response.status_code == 302
    [message] = messages_of(response)
    assert (
        message
        == f"0 done, 1 skipped: operator request {str(request.request_id)[:8]} of Laptop 1: rejected, not pending"
    )
    request.refresh_from_db()
    assert request.status == PairingStatus.REJECTED
    assert request.resolved_by == "cli"
    assert not PairedDevice.objects.exists()
    assert AuditLog.objects.count() == audit_rows
    assert not LogEntry.objects.exists()


def test_overdue_request_is_skipped_with_reason(admin_client, make_pairing_request):
    request = make_pairing_request(1)
    DevicePairingRequest.objects.filter(pk=request.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    response = run_action(admin_client, DevicePairingRequest, "approve_requests", [request], index=0)

    assert response.status_code == 302
    assert messages_of(response) == [
        f"0 done, 1 skipped: operator request {str(request.request_id)[:8]} of Laptop 1: "
        "expired (awaiting the expiry sweep)"
    ]
    request.refresh_from_db()
    assert request.status == PairingStatus.PENDING
    assert not PairedDevice.objects.exists()
    assert not AuditLog.objects.exists()


def test_approve_handles_a_mixed_selection_per_object(admin_client, make_pairing_request):
    open_request = make_pairing_request(1)
    approved = make_pairing_request(2)
    pairing.pairing_request_approve(request_id=str(approved.request_id), actor=Actor.system("cli"))

    response = run_action(admin_client, DevicePairingRequest, "approve_requests", [open_request, approved], index=0)

    assert response.status_code == 302
    [message] = messages_of(response)
    assert message.startswith("1 done, 1 skipped: ")
    assert message.endswith(": approved, not pending")
    open_request.refresh_from_db()
    assert open_request.status == PairingStatus.APPROVED
    assert PairedDevice.objects.count() == 2
    assert AuditLog.objects.filter(actor="user:admin").count() == 1


def test_service_errors_are_reported_as_skips(admin_client, make_pairing_request, monkeypatch):
    request = make_pairing_request(1)

    def lost_race(**kwargs):
        raise InvalidRequest("unknown requestId")

    monkeypatch.setattr(pairing, "pairing_request_approve", lost_race)

    response = run_action(admin_client, DevicePairingRequest, "approve_requests", [request], index=0)

    assert response.status_code == 302
    assert messages_of(response) == [
        f"0 done, 1 skipped: operator request {str(request.request_id)[:8]} of Laptop 1: unknown requestId"
    ]
    request.refresh_from_db()
    assert request.status == PairingStatus.PENDING
    assert not LogEntry.objects.exists()


# --- device actions -------------------------------------------------------------------------


def test_remove_device_asks_for_confirmation_first(admin_client, make_device, make_token, make_connection):
    device = make_device(1)
    make_token(device)
    make_connection(device)

    response = run_action(admin_client, PairedDevice, "remove_devices", [device], index=0)

    assert response.status_code == 200
    assert "admin/devices_app/paireddevice/remove_confirmation.html" in [t.name for t in response.templates]
    content = response.content.decode()
    assert device.device_id in content
    assert 'name="post" value="yes"' in content
    assert 'name="action" value="remove_devices"' in content
    assert PairedDevice.objects.filter(pk=device.pk).exists()
    assert not AuditLog.objects.exists()


def test_remove_device_after_confirmation(admin_client, admin_user, make_device, make_token, make_connection):
    device = make_device(1)
    make_token(device)
    make_connection(device)
    kept = make_device(2)

    response = run_action(admin_client, PairedDevice, "remove_devices", [device], post="yes")

    assert response.status_code == 302
    assert messages_of(response) == ["1 done, 0 skipped"]
    assert not PairedDevice.objects.filter(pk=device.pk).exists()
    assert PairedDevice.objects.filter(pk=kept.pk).exists()
    assert not DeviceToken.objects.filter(device_id=device.pk).exists()
    assert not GatewayConnection.objects.filter(device_id=device.pk).exists()
    audit = AuditLog.objects.get()
    assert (audit.action, audit.actor, audit.actor_user, audit.target_id) == (
        "device.pair.remove",
        "user:admin",
        admin_user,
        device.device_id,
    )
    history = LogEntry.objects.get()
    assert (history.action_flag, history.object_id) == (DELETION, device.pk)


def test_remove_device_needs_the_delete_permission(client, django_user_model, make_device):
    device = make_device(1)
    staff = operator_user("staff", sc.PAIRING, is_staff=True)  # the scope, not the model permission, lacks here
    staff.user_permissions.add(*Permission.objects.filter(codename__in=["view_paireddevice", "change_paireddevice"]))
    client.force_login(staff)

    page = client.get(admin_url(PairedDevice, "changelist"))
    response = run_action(client, PairedDevice, "remove_devices", [device], post="yes")

    assert page.status_code == 200
    action_names = [name for name, _ in page.context["action_form"].fields["action"].choices]
    assert "remove_devices" not in action_names
    assert "revoke_device_tokens" in action_names
    assert response.status_code == 302
    assert messages_of(response) == ["No action selected."]
    assert PairedDevice.objects.filter(pk=device.pk).exists()
    assert not AuditLog.objects.exists()


def test_revoke_all_device_tokens(admin_client, admin_user, make_device, make_token, make_connection):
    device = make_device(1, roles=[sc.ROLE_NODE, sc.ROLE_OPERATOR])
    operator_token = make_token(device, sc.ROLE_OPERATOR)
    node_token = make_token(device, sc.ROLE_NODE)
    make_connection(device, sc.ROLE_OPERATOR)
    bystander = make_token(make_device(2))

    response = run_action(admin_client, PairedDevice, "revoke_device_tokens", [device], index=0)

    assert response.status_code == 302
    assert messages_of(response) == ["1 done, 0 skipped"]
    operator_token.refresh_from_db()
    node_token.refresh_from_db()
    bystander.refresh_from_db()
    assert operator_token.revoked_at is not None
    assert node_token.revoked_at is not None
    assert bystander.revoked_at is None
    assert not GatewayConnection.objects.filter(device_id=device.pk).exists()
    audits = AuditLog.objects.order_by("data__role")
    assert [(a.action, a.actor, a.actor_user, a.data["role"]) for a in audits] == [
        ("device.token.revoke", "user:admin", admin_user, sc.ROLE_NODE),
        ("device.token.revoke", "user:admin", admin_user, sc.ROLE_OPERATOR),
    ]
    assert LogEntry.objects.get(object_id=device.pk).change_message == (
        "Revoked device tokens (node, operator) via admin action."
    )


def test_revoke_all_skips_devices_without_active_tokens(admin_client, make_device, make_token):
    device = make_device(1)
    make_token(device, revoked=True)

    response = run_action(admin_client, PairedDevice, "revoke_device_tokens", [device], index=0)

    assert response.status_code == 302
    assert messages_of(response) == [f"0 done, 1 skipped: {device}: no active tokens"]
    assert not AuditLog.objects.exists()
    assert not LogEntry.objects.exists()


# --- token actions --------------------------------------------------------------------------


def test_revoke_selected_tokens(admin_client, admin_user, make_device, make_token):
    device = make_device(1, roles=[sc.ROLE_NODE, sc.ROLE_OPERATOR])
    active = make_token(device, sc.ROLE_OPERATOR)
    already = make_token(device, sc.ROLE_NODE, revoked=True)
    revoked_at = already.revoked_at

    response = run_action(admin_client, DeviceToken, "revoke_tokens", [active, already], index=0)

    assert response.status_code == 302
    assert messages_of(response) == [f"1 done, 1 skipped: {already}: already revoked"]
    active.refresh_from_db()
    already.refresh_from_db()
    assert active.revoked_at is not None
    assert already.revoked_at == revoked_at
    audit = AuditLog.objects.get()
    assert (audit.action, audit.actor, audit.actor_user, audit.data) == (
        "device.token.revoke",
        "user:admin",
        admin_user,
        {"role": sc.ROLE_OPERATOR, "before": "active", "after": "revoked"},
    )
    history = LogEntry.objects.get()
    assert (history.object_id, history.change_message) == (str(active.pk), "Revoked via admin action.")


def test_rotate_tokens_asks_for_confirmation_first(admin_client, make_device, make_token, make_connection):
    device = make_device(1)
    token = make_token(device)
    make_connection(device)

    response = run_action(admin_client, DeviceToken, "rotate_tokens", [token], index=0)

    assert response.status_code == 200
    assert "admin/action_confirmation.html" in [t.name for t in response.templates]
    content = response.content.decode()
    assert 'name="post" value="yes"' in content and 'name="action" value="rotate_tokens"' in content
    assert "Yes, rotate 1 token" in content
    token.refresh_from_db()
    assert token.token_hash == hash_device_token(f"secret-{device.device_id}-operator")
    assert GatewayConnection.objects.filter(device_id=device.pk).exists()
    assert not AuditLog.objects.exists()


def test_rotate_tokens_shows_each_new_secret_once_and_audits_the_user(
    admin_client, admin_user, make_device, make_token, make_connection
):
    device = make_device(1)
    token = make_token(device)
    make_connection(device)

    response = run_action(admin_client, DeviceToken, "rotate_tokens", [token], post="yes")

    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    content = response.content.decode()
    assert "Copy each new token now: it is not shown again." in content
    secret = re.search(r'<input type="text" readonly value="([^"]+)"', content).group(1)
    record = tokens.device_token_verify(device_id=device.device_id, role=sc.ROLE_OPERATOR, token=secret)
    assert record.scopes == [sc.READ, sc.WRITE]  # the device's approved scopes, as device.token.rotate gives
    assert not GatewayConnection.objects.filter(device_id=device.pk).exists()  # its connections closed
    assert messages_of(response) == ["1 done, 0 skipped"]
    audit = AuditLog.objects.get()
    assert (audit.action, audit.actor, audit.actor_user) == ("device.token.rotate", "user:admin", admin_user)
    assert audit.data["tokenDelivery"] == "shown-to-operator" and secret not in str(audit.data)
    history = LogEntry.objects.get()
    assert (history.object_id, history.change_message) == (str(token.pk), "Rotated via admin action.")
    assert secret not in admin_client.get(admin_url(DeviceToken, "change", token.pk)).content.decode()


def test_rotate_tokens_skips_with_the_services_refusal_when_the_role_was_withdrawn(
    admin_client, make_device, make_token
):
    device = make_device(1, roles=[sc.ROLE_OPERATOR])
    stale = make_token(device, sc.ROLE_NODE)  # the node role is gone; its token row was left behind

    response = run_action(admin_client, DeviceToken, "rotate_tokens", [stale], post="yes")

    assert response.status_code == 200
    assert messages_of(response) == [f"0 done, 1 skipped: {stale}: device token rotation denied"]
    assert "No token was rotated." in response.content.decode()
    stale.refresh_from_db()
    assert stale.token_hash == hash_device_token(f"secret-{device.device_id}-node")
    assert not AuditLog.objects.exists() and not LogEntry.objects.exists()


# --- the audit trail ------------------------------------------------------------------------


def test_the_audit_log_shows_who_what_before_and_after_and_filters_by_object(
    admin_client, make_device, make_token, make_pairing_request
):
    approved = make_pairing_request(1)
    pairing.pairing_request_approve(request_id=str(approved.request_id), actor=Actor.system("cli"))
    other = make_device(2)
    make_token(other)
    run_action(admin_client, DeviceToken, "revoke_tokens", [DeviceToken.objects.get(device=other)], index=0)

    response = admin_client.get(
        admin_url(AuditLog, "changelist"), {"target_type__exact": "device", "target_id__exact": other.device_id}
    )

    assert response.status_code == 200
    [row] = response.context["cl"].result_list
    assert (row.action, row.actor, row.target_id) == ("device.token.revoke", "user:admin", other.device_id)
    content = response.content.decode()
    assert f"Audit history of device {other.device_id}" in content
    assert '<td class="field-before_column">active</td>' in content
    assert '<td class="field-after_column">revoked</td>' in content
    everything = admin_client.get(admin_url(AuditLog, "changelist")).content.decode()
    assert escape(audit_history_url(approved.device_id, "device")) in everything  # each row links its object
    assert "&quot;roles&quot;: [&quot;operator&quot;]" in everything  # approval's after state
    searched = admin_client.get(admin_url(AuditLog, "changelist"), {"q": approved.device_id})
    assert [r.action for r in searched.context["cl"].result_list] == ["device.pair.approve"]


def test_each_pairing_objects_page_links_its_audit_history(admin_client, make_device, make_token, make_pairing_request):
    device = make_device(1)
    token = make_token(device)
    request = make_pairing_request(2)

    pages = {
        admin_url(PairedDevice, "change", device.pk): audit_history_url(device.device_id),
        admin_url(DeviceToken, "change", token.pk): audit_history_url(device.device_id, "device"),
        admin_url(DevicePairingRequest, "change", request.pk): audit_history_url(request.device_id),
    }

    for page, history in pages.items():
        response = admin_client.get(page)
        assert response.status_code == 200
        assert escape(history) in response.content.decode(), page


@pytest.mark.parametrize("model", [DevicePairingRequest, GatewayProcess], ids=lambda m: m.__name__)
def test_request_and_process_changelists_have_no_n_plus_one(
    admin_client, django_assert_max_num_queries, make_pairing_request, model
):
    now = timezone.now()
    for n in range(25):
        make_pairing_request(n + 1)
        GatewayProcess.objects.create(
            boot_id=uuid.uuid4(), hostname=f"gw-{n}", pid=n + 1, started_at=now, heartbeat_at=now
        )

    # Session, user, the counts, the page and the value filters' lists (hostname, reason): none per row.
    with django_assert_max_num_queries(10):
        response = admin_client.get(admin_url(model, "changelist"))

    assert response.status_code == 200
    assert len(response.context["cl"].result_list) == 25
