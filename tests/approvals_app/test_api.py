"""The approvals JSON API, full stack: the exec.approval.* / exec.approvals.* services and payloads over HTTP,
and every refusal with its status, exact message and nothing changed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from approvals_app.models import ExecApproval, ExecApprovalPolicy
from approvals_app.services import approvals
from gateway.models import AuditLog
from tests.support.api import API_TOKEN

from .conftest import CWD, NODE_ID, ask

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _token(api_token):
    return api_token


@pytest.fixture
def client() -> Client:
    return Client(headers={"Authorization": f"Bearer {API_TOKEN}"})


def world() -> dict:
    return {
        "approvals": list(ExecApproval.objects.order_by("pk").values()),
        "policies": list(ExecApprovalPolicy.objects.order_by("pk").values()),
        "audit": AuditLog.objects.count(),
    }


def refused(response, status: int, message: str, *, before: dict, details: dict | None = None) -> None:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert (error["code"], error["message"]) == ("INVALID_REQUEST", message)
    if details is not None:
        assert error["details"] == details
    assert world() == before


def pending(**overrides) -> ExecApproval:
    return approvals.exec_approval_request(**ask(**overrides))


def test_every_route_needs_the_gateway_token():
    approval = pending()
    before = world()
    routes = [
        ("get", "/api/approvals/"),
        ("get", "/api/approvals/history"),
        ("get", "/api/approvals/policy"),
        ("put", "/api/approvals/policy"),
        ("get", f"/api/approvals/nodes/{NODE_ID}/policy"),
        ("put", f"/api/approvals/nodes/{NODE_ID}/policy"),
        ("get", f"/api/approvals/{approval.pk}"),
        ("post", f"/api/approvals/{approval.pk}/resolve"),
    ]
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        for verb, url in routes:
            response = getattr(Client(headers=headers), verb)(
                url, {"decision": "deny"}, content_type="application/json"
            )
            assert response.status_code == 401, (verb, url)
    assert world() == before


def test_pending_list_get_and_resolve(client):
    approval = pending()
    listed = client.get("/api/approvals/")
    assert listed.status_code == 200
    assert listed.json() == [
        {
            "id": approval.pk,
            "request": approval.request,
            "createdAtMs": int(approval.created_at.timestamp() * 1000),
            "expiresAtMs": int(approval.expires_at.timestamp() * 1000),
            "approvalKind": "exec",
        }
    ]
    got = client.get(f"/api/approvals/{approval.pk}")
    assert got.status_code == 200
    assert got.json()["commandText"] == "git push origin main"
    assert got.json()["allowedDecisions"] == ["allow-once", "allow-always", "deny"]

    resolved = client.post(f"/api/approvals/{approval.pk}/resolve", {"decision": "allow-always"}, "application/json")
    assert resolved.status_code == 200 and resolved.json() == {"ok": True}
    approval.refresh_from_db()
    assert (approval.status, approval.decision, approval.resolved_by) == ("approved", "allow-always", "api:token")
    assert (
        ExecApprovalPolicy.objects.get(scope="gateway").document["agents"]["main"]["allowlist"][0]["pattern"] == "git"
    )
    again = client.post(f"/api/approvals/{approval.pk}/resolve", {"decision": "allow-always"}, "application/json")
    assert again.status_code == 200
    assert client.get("/api/approvals/").json() == []


def test_resolve_refusals(client):
    approval = pending()
    before = world()
    refused(
        client.post(f"/api/approvals/{approval.pk}/resolve", {"decision": "maybe"}, "application/json"),
        400,
        "invalid decision",
        before=before,
    )
    refused(
        client.post("/api/approvals/nope/resolve", {"decision": "deny"}, "application/json"),
        404,
        "unknown or expired approval id",
        before=before,
        details={
            "reason": "APPROVAL_NOT_FOUND",
            "remediation": "Re-request the action; pending approvals are cleared after expiry or restart.",
        },
    )
    refused(client.get("/api/approvals/nope"), 404, "unknown or expired approval id", before=before)
    refused(
        client.post(f"/api/approvals/{approval.pk}/resolve", {"decision": "deny", "extra": 1}, "application/json"),
        400,
        "invalid request: at /extra (body): unexpected property",
        before=before,
    )
    client.post(f"/api/approvals/{approval.pk}/resolve", {"decision": "deny"}, "application/json")
    before = world()
    refused(
        client.post(f"/api/approvals/{approval.pk}/resolve", {"decision": "allow-once"}, "application/json"),
        409,
        "approval already resolved",
        before=before,
        details={"reason": "APPROVAL_ALREADY_RESOLVED"},
    )
    # Past its expiry: not decidable, not listed.
    overdue = pending(tool_call_id="call-2")
    ExecApproval.objects.filter(pk=overdue.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    before = world()
    refused(
        client.post(f"/api/approvals/{overdue.pk}/resolve", {"decision": "deny"}, "application/json"),
        404,
        "unknown or expired approval id",
        before=before,
    )
    assert client.get("/api/approvals/").json() == []


def test_history_pages(client):
    made = [pending(tool_call_id=f"call-{i}") for i in range(3)]
    for approval in made:
        client.post(f"/api/approvals/{approval.pk}/resolve", {"decision": "deny"}, "application/json")
    first = client.get("/api/approvals/history", {"limit": 2}).json()
    second = client.get("/api/approvals/history", {"limit": 2, "cursor": first["nextCursor"]}).json()
    assert [a["id"] for a in first["items"] + second["items"]] == [a.pk for a in made][::-1]
    assert "nextCursor" not in second
    assert first["items"][0]["resolver"] == {"kind": "runtime", "id": "api:token"}
    before = world()
    refused(
        client.get("/api/approvals/history", {"cursor": "x"}), 400, "invalid approval.history cursor", before=before
    )
    refused(
        client.get("/api/approvals/history", {"limit": 0}),
        400,
        "invalid request: at /limit (query): Input should be greater than or equal to 1",
        before=before,
    )


def test_the_gateways_policy_get_and_put_with_its_hash(client):
    empty = client.get("/api/approvals/policy").json()
    assert empty["exists"] is False and empty["file"] == {"version": 1, "defaults": {}, "agents": {}}
    document = {"version": 1, "defaults": {"security": "deny"}}
    stored = client.put("/api/approvals/policy", {"file": document}, "application/json")
    assert stored.status_code == 200, stored.content
    assert stored.json()["resolvedDefaults"]["security"] == "deny"
    row = ExecApprovalPolicy.objects.get(scope="gateway")
    assert (row.hash, row.updated_by) == (stored.json()["hash"], "api:token")

    before = world()
    refused(
        client.put("/api/approvals/policy", {"file": document}, "application/json"),
        400,
        "exec approvals base hash required; re-run exec.approvals.get and retry",
        before=before,
    )
    refused(
        client.put("/api/approvals/policy", {"file": document, "baseHash": empty["hash"]}, "application/json"),
        409,
        "exec approvals changed since last load; re-run exec.approvals.get and retry",
        before=before,
    )
    refused(
        client.put(
            "/api/approvals/policy",
            {"file": {"version": 1, "defaults": {"security": "yes"}}, "baseHash": row.hash},
            "application/json",
        ),
        400,
        "invalid exec approvals file: at /defaults/security: must be one of deny, allowlist, full",
        before=before,
    )
    ok = client.put("/api/approvals/policy", {"file": {"version": 1}, "baseHash": row.hash}, "application/json")
    assert ok.status_code == 200 and ok.json()["resolvedDefaults"]["security"] == "allowlist"


def test_a_nodes_policy(client, node):
    got = client.get(f"/api/approvals/nodes/{NODE_ID}/policy")
    assert got.status_code == 200 and got.json()["path"].endswith(f"node:{NODE_ID}")
    put = client.put(f"/api/approvals/nodes/{NODE_ID}/policy", {"file": {"version": 1}}, "application/json")
    assert put.status_code == 200 and put.json()["exists"] is True
    before = world()
    refused(client.get(f"/api/approvals/nodes/{'f' * 64}/policy"), 404, "unknown nodeId", before=before)
    refused(
        client.put(f"/api/approvals/nodes/{'f' * 64}/policy", {"file": {"version": 1}}, "application/json"),
        404,
        "unknown nodeId",
        before=before,
    )


def test_a_decision_made_over_http_is_the_one_a_waiting_turn_gets(client):
    approval = pending(cwd=CWD)
    client.post(f"/api/approvals/{approval.pk}/resolve", {"decision": "allow-once"}, "application/json")
    assert approvals.exec_approval_request(**ask()).decision == "allow-once"
