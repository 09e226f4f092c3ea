"""Admin of exec approvals (read-only, an audited deny action) and of exec policy documents (edited as JSON
through the service, with the hash they were opened with)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from approvals_app.models import ExecApproval, ExecApprovalPolicy
from approvals_app.services import approvals, policies
from gateway.audit import Actor
from gateway.models import AuditLog

from .conftest import NODE_ID, ask

pytestmark = pytest.mark.django_db


def url(model, view: str, *args) -> str:
    return reverse(f"admin:approvals_app_{model._meta.model_name}_{view}", args=args)


def messages_of(response) -> list[str]:
    return [m.message for m in get_messages(response.wsgi_request)]


def pending(**overrides) -> ExecApproval:
    return approvals.exec_approval_request(**ask(**overrides))


# --- approvals ---------------------------------------------------------------------------------------


def test_approvals_are_listed_filtered_searched_and_read_only(admin_client):
    wanted = pending(command="make deploy")
    pending(tool_call_id="call-2", command="ls", session_key="agent:ops:x", agent_id="ops")

    changelist = admin_client.get(url(ExecApproval, "changelist"))
    searched = admin_client.get(url(ExecApproval, "changelist"), {"q": "deploy"})
    by_agent = admin_client.get(url(ExecApproval, "changelist"), {"agent_id": "ops"})
    opened = admin_client.get(url(ExecApproval, "changelist"), {"state": "open"})
    change = admin_client.get(url(ExecApproval, "change", wanted.pk))

    assert changelist.status_code == 200 and len(changelist.context["cl"].result_list) == 2
    assert [a.pk for a in searched.context["cl"].result_list] == [wanted.pk]
    assert [a.command for a in by_agent.context["cl"].result_list] == ["ls"]
    assert len(opened.context["cl"].result_list) == 2
    assert change.status_code == 200 and change.context["has_change_permission"] is False
    assert 'name="_save"' not in change.content.decode()
    assert "make deploy" in change.content.decode()


def test_the_changelist_has_no_n_plus_one(admin_client, django_assert_max_num_queries):
    for i in range(20):
        pending(tool_call_id=f"call-{i}")
    # Django session, user, the count (+ the planner's estimate on PostgreSQL), the page, the host and agent
    # filters' distinct values, the date hierarchy's two: none of it per row.
    with django_assert_max_num_queries(9):
        response = admin_client.get(url(ExecApproval, "changelist"))
    assert len(response.context["cl"].result_list) == 20


def test_the_deny_action_denies_pending_approvals_through_the_service(admin_client):
    open_one = pending()
    decided = pending(tool_call_id="call-2")
    approvals.exec_approval_resolve(approval_id=decided.pk, decision="allow-once", actor=Actor(label="device:op"))
    overdue = pending(tool_call_id="call-3")
    ExecApproval.objects.filter(pk=overdue.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    response = admin_client.post(
        url(ExecApproval, "changelist"),
        {"action": "deny_pending", "_selected_action": [open_one.pk, decided.pk, overdue.pk], "index": 0},
    )

    assert response.status_code == 302
    [message] = messages_of(response)
    assert message.startswith("1 done, 2 skipped: ")
    assert "approved, not pending" in message and "expired (awaiting the expiry sweep)" in message
    open_one.refresh_from_db()
    assert (open_one.status, open_one.decision, open_one.resolved_by) == ("denied", "deny", "user:admin")
    audit = AuditLog.objects.get(action="exec.approval.resolve", target_id=open_one.pk)
    assert audit.actor_user.username == "admin"
    assert LogEntry.objects.get(object_id=open_one.pk).change_message == "Denied via admin action."
    assert ExecApproval.objects.get(pk=decided.pk).status == "approved"
    assert ExecApproval.objects.get(pk=overdue.pk).status == "pending"


# --- policy documents ----------------------------------------------------------------------------------


def test_a_document_is_edited_as_json_through_the_service(admin_client):
    row = policies.exec_policy_set(scope="gateway", file={"version": 1}, base_hash=None, actor=Actor(label="op"))
    change = admin_client.get(url(ExecApprovalPolicy, "change", "gateway"))
    assert change.status_code == 200
    form = change.context["adminform"].form
    assert form["base_hash"].value() == row.hash

    edited = {"version": 1, "defaults": {"security": "deny"}}
    response = admin_client.post(
        url(ExecApprovalPolicy, "change", "gateway"),
        {"scope": "gateway", "document_json": json.dumps(edited), "base_hash": row.hash},
    )

    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else ""
    stored = ExecApprovalPolicy.objects.get(scope="gateway")
    assert stored.document == {"version": 1, "defaults": {"security": "deny"}, "agents": {}}
    assert stored.updated_by == "user:admin"
    assert AuditLog.objects.filter(action="exec.approvals.set", actor="user:admin").count() == 1
    assert LogEntry.objects.filter(object_id="gateway").count() == 1


def test_a_stale_or_invalid_edit_is_a_form_error_and_changes_nothing(admin_client):
    row = policies.exec_policy_set(scope="gateway", file={"version": 1}, base_hash=None, actor=Actor(label="op"))
    opened_with = row.hash
    newer = policies.exec_policy_set(
        scope="gateway", file={"version": 1, "defaults": {"ask": "always"}}, base_hash=row.hash, actor=Actor(label="op")
    )
    cases = [
        (json.dumps({"version": 1}), opened_with, "exec approvals changed since last load: reload this page"),
        ("{not json", newer.hash, "not JSON:"),
        (json.dumps({"version": 1, "extra": 1}), newer.hash, "invalid exec approvals file: at /extra: unexpected"),
    ]
    for document, base_hash, error in cases:
        response = admin_client.post(
            url(ExecApprovalPolicy, "change", "gateway"),
            {"scope": "gateway", "document_json": document, "base_hash": base_hash},
        )
        assert response.status_code == 200
        assert error in str(response.context["adminform"].form.errors)
    assert ExecApprovalPolicy.objects.get(scope="gateway").hash == newer.hash
    assert AuditLog.objects.filter(action="exec.approvals.set").count() == 2


def test_a_lost_race_after_the_forms_check_is_reported_not_saved(admin_client, monkeypatch):
    row = policies.exec_policy_set(scope="gateway", file={"version": 1}, base_hash=None, actor=Actor(label="op"))
    original = policies.exec_policy_set

    def someone_wrote_first(**kwargs):
        original(
            scope="gateway",
            file={"version": 1, "defaults": {"security": "full"}},
            base_hash=row.hash,
            actor=Actor(label="other"),
        )
        return original(**kwargs)

    monkeypatch.setattr(policies, "exec_policy_set", someone_wrote_first)
    response = admin_client.post(
        url(ExecApprovalPolicy, "change", "gateway"),
        {"scope": "gateway", "document_json": json.dumps({"version": 1}), "base_hash": row.hash},
    )
    assert response.status_code == 302
    assert messages_of(response) == [
        "Not saved: exec approvals changed since last load; re-run exec.approvals.get and retry"
    ]
    assert ExecApprovalPolicy.objects.get(scope="gateway").document["defaults"] == {"security": "full"}
    assert not LogEntry.objects.exists()


def test_a_nodes_document_is_added_for_paired_nodes_only(admin_client, node):
    refused = admin_client.post(
        url(ExecApprovalPolicy, "add"), {"scope": "node:" + "f" * 64, "document_json": json.dumps({"version": 1})}
    )
    assert refused.status_code == 200 and "unknown nodeId" in str(refused.context["adminform"].form.errors)
    added = admin_client.post(
        url(ExecApprovalPolicy, "add"), {"scope": f"node:{NODE_ID}", "document_json": json.dumps({"version": 1})}
    )
    assert added.status_code == 302
    assert ExecApprovalPolicy.objects.get(scope=f"node:{NODE_ID}").updated_by == "user:admin"
    listed = admin_client.get(url(ExecApprovalPolicy, "changelist"))
    assert listed.status_code == 200 and f"node:{NODE_ID}" in listed.content.decode()


def test_a_viewer_sees_the_document_read_only(client, django_user_model):
    policies.exec_policy_set(
        scope="gateway", file={"version": 1, "defaults": {"security": "deny"}}, base_hash=None, actor=Actor(label="op")
    )
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(
        Permission.objects.get(codename="view_execapprovalpolicy"), Permission.objects.get(codename="view_execapproval")
    )
    client.force_login(viewer)

    page = client.get(url(ExecApprovalPolicy, "change", "gateway"))
    denied = client.post(
        url(ExecApprovalPolicy, "change", "gateway"),
        {"scope": "gateway", "document_json": json.dumps({"version": 1}), "base_hash": "x"},
    )
    deny_action = client.post(
        url(ExecApproval, "changelist"), {"action": "deny_pending", "_selected_action": [pending().pk], "index": 0}
    )

    assert page.status_code == 200
    content = page.content.decode()
    assert "&quot;security&quot;: &quot;deny&quot;" in content and "<textarea" not in content
    assert denied.status_code == 403
    assert ExecApprovalPolicy.objects.get(scope="gateway").document["defaults"] == {"security": "deny"}
    assert deny_action.status_code in (200, 302) and ExecApproval.objects.get().status == "pending"
