"""The exec approval methods through the gateway's own request path (scope check, params, handler, its database
hop) and their events fanned out to connections as a gateway process does: who may call what, who hears what,
every refusal with its exact error and nothing written."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from approvals_app import waiters
from approvals_app.models import ExecApproval, ExecApprovalPolicy
from approvals_app.services import approvals as approvals_service
from gateway import scopes as sc
from gateway.context import RpcContext
from gateway.cursors import cursor_encode
from gateway.dispatch import run_request
from gateway.models import AuditLog, GatewayConnection
from gateway.protocol import RequestFrame
from gateway.registry import registry

from .conftest import CWD, NODE_ID, ctx, deliver, operator_socket, refusal, wire

pytestmark = pytest.mark.django_db(transaction=True)

APPROVER = ctx(sc.APPROVALS, conn_id="approver", device_id="approver-device")
ADMIN = ctx(sc.ADMIN, conn_id="admin")
WRITER = ctx(sc.READ, sc.WRITE, conn_id="writer")
NOT_FOUND_DETAILS = {
    "reason": "APPROVAL_NOT_FOUND",
    "remediation": "Re-request the action; pending approvals are cleared after expiry or restart.",
}


@pytest.fixture(autouse=True)
def _fast_rechecks(monkeypatch):
    # The tests' publications do not reach a process listener: waiters find decisions by re-reading.
    monkeypatch.setattr(waiters, "RECHECK_S", 0.05)


def world() -> dict:
    return {
        "approvals": list(ExecApproval.objects.order_by("pk").values()),
        "policies": list(ExecApprovalPolicy.objects.order_by("pk").values()),
        "audit": AuditLog.objects.count(),
    }


def two_phase(context: RpcContext = APPROVER, **params) -> dict:
    response = wire(context, "exec.approval.request", {"command": "git push", "cwd": CWD, "twoPhase": True, **params})
    assert response["ok"], response
    return response["payload"]


# --- methods, scopes and roles -------------------------------------------------------------------------


def test_the_methods_and_events_are_registered_with_their_scopes():
    expected = {
        "exec.approvals.get": sc.ADMIN,
        "exec.approvals.set": sc.ADMIN,
        "exec.approvals.node.get": sc.ADMIN,
        "exec.approvals.node.set": sc.ADMIN,
        "exec.approval.request": sc.APPROVALS,
        "exec.approval.waitDecision": sc.APPROVALS,
        "exec.approval.get": sc.APPROVALS,
        "exec.approval.list": sc.APPROVALS,
        "exec.approval.resolve": sc.APPROVALS,
        "approval.history": sc.APPROVALS,
    }
    assert {name: registry.methods[name].scope for name in expected} == expected
    assert set(expected) <= set(registry.method_names())
    for event in ("exec.approval.requested", "exec.approval.resolved"):
        spec = registry.events[event]
        assert (spec.scope, spec.operators_only, spec.subscription) == (sc.APPROVALS, True, None)


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("exec.approval.request", {"command": "ls"}),
        ("exec.approval.waitDecision", {"id": "x"}),
        ("exec.approval.get", {"id": "x"}),
        ("exec.approval.list", {}),
        ("exec.approval.resolve", {"id": "x", "decision": "deny"}),
        ("approval.history", {}),
    ],
)
def test_an_operator_without_operator_approvals_can_neither_ask_nor_decide(method, params):
    before = world()
    response = wire(WRITER, method, params)
    assert refusal(response) == ("INVALID_REQUEST", "missing scope: operator.approvals")
    assert response["error"]["details"] == {
        "code": "MISSING_SCOPE",
        "missingScope": sc.APPROVALS,
        "requiredScopes": [sc.APPROVALS],
    }
    node = RpcContext(
        conn_id="n",
        channel_name="inmemory!n",
        role=sc.ROLE_NODE,
        scopes=[],
        auth_method="device-token",
        client_id="node-host",
        client_mode="node",
    )
    assert refusal(wire(node, method, params)) == ("INVALID_REQUEST", "unauthorized role: node")
    assert world() == before


@pytest.mark.parametrize(
    "method", ["exec.approvals.get", "exec.approvals.set", "exec.approvals.node.get", "exec.approvals.node.set"]
)
def test_the_policy_documents_need_operator_admin(method):
    params = {"nodeId": NODE_ID} if ".node." in method else {}
    if method.endswith(".set"):
        params["file"] = {"version": 1}
    before = world()
    assert refusal(wire(APPROVER, method, params)) == ("INVALID_REQUEST", "missing scope: operator.admin")
    assert world() == before


def test_operator_admin_may_decide_too():
    approval_id = two_phase()["id"]
    assert wire(ADMIN, "exec.approval.resolve", {"id": approval_id, "decision": "deny"})["payload"] == {"ok": True}


# --- asking and deciding, with the events -------------------------------------------------------------


def test_the_events_reach_operators_with_operator_approvals_only(published):
    approver, admin = operator_socket(sc.APPROVALS), operator_socket(sc.ADMIN)
    writer, node = operator_socket(sc.READ, sc.WRITE), operator_socket(role=sc.ROLE_NODE)
    sockets = [approver, admin, writer, node]

    approval_id = two_phase()["id"]
    assert wire(APPROVER, "exec.approval.resolve", {"id": approval_id, "decision": "allow-once"})["ok"]
    deliver(published, sockets)

    for socket in (approver, admin):
        assert socket.events() == ["exec.approval.requested", "exec.approval.resolved"]
    assert writer.events() == [] and node.events() == []
    requested, resolved = (frame for frame in approver.frames if frame["type"] == "event")
    row = ExecApproval.objects.get(pk=approval_id)
    assert requested["payload"] == {
        "approvalKind": "exec",
        "id": approval_id,
        "request": row.request,
        "createdAtMs": int(row.created_at.timestamp() * 1000),
        "expiresAtMs": int(row.expires_at.timestamp() * 1000),
    }
    assert resolved["payload"]["decision"] == "allow-once"
    assert resolved["payload"]["resolvedBy"] == "device:approver-device"
    assert row.requested_by == "device:approver-device" and row.requested_by_conn == "approver"


def test_a_request_answers_once_an_operator_decided(published):
    async def scenario():
        frame = RequestFrame(
            type="req",
            id="ask",
            method="exec.approval.request",
            params={"command": "make deploy", "cwd": CWD, "id": "deploy-1", "timeoutMs": 60_000},
        )
        asking = asyncio.create_task(run_request(APPROVER, frame))
        while not await database_sync_to_async(ExecApproval.objects.filter(pk="deploy-1").exists)():
            await asyncio.sleep(0.02)
        listed = await run_request(ADMIN, RequestFrame(type="req", id="l", method="exec.approval.list", params={}))
        decided = await run_request(
            ctx(sc.APPROVALS, conn_id="other"),
            RequestFrame(
                type="req",
                id="d",
                method="exec.approval.resolve",
                params={"id": "deploy-1", "decision": "allow-always"},
            ),
        )
        return listed, decided, await asyncio.wait_for(asking, 5)

    listed, decided, answered = asyncio.run(scenario())
    row = ExecApproval.objects.get(pk="deploy-1")
    assert [item["id"] for item in listed["payload"]] == ["deploy-1"]
    assert listed["payload"][0]["approvalKind"] == "exec" and listed["payload"][0]["request"] == row.request
    assert decided["payload"] == {"ok": True}
    assert answered == {
        "type": "res",
        "id": "ask",
        "ok": True,
        "payload": {
            "id": "deploy-1",
            "decision": "allow-always",
            "createdAtMs": int(row.created_at.timestamp() * 1000),
            "expiresAtMs": int(row.expires_at.timestamp() * 1000),
        },
    }
    # allow-always kept "make deploy" in this directory for the asking agent (main) on the gateway.
    [entry] = ExecApprovalPolicy.objects.get(scope="gateway").document["agents"]["main"]["allowlist"]
    assert entry["pattern"] == "make"


def test_a_request_that_expires_answers_decision_null():
    response = wire(APPROVER, "exec.approval.request", {"command": "ls", "timeoutMs": 200})
    row = ExecApproval.objects.get()
    assert response["payload"] == {
        "id": row.pk,
        "decision": None,
        "createdAtMs": int(row.created_at.timestamp() * 1000),
        "expiresAtMs": int(row.expires_at.timestamp() * 1000),
    }
    assert (row.status, row.terminal_reason) == ("expired", "timeout")


def test_two_phase_answers_at_once_with_its_delivery_route(gateway_process):
    alone = two_phase()
    assert alone["status"] == "accepted" and alone["deliveryRoute"] == "none"
    assert set(alone) == {"status", "id", "deliveryRoute", "createdAtMs", "expiresAtMs"}
    # An operator connection that may decide is live (the requester's own does not count).
    GatewayConnection.objects.create(
        conn_id=uuid.uuid4(),
        process=gateway_process,
        channel_name="inmemory!x",
        role=sc.ROLE_OPERATOR,
        scopes=[sc.APPROVALS],
        auth_method="token",
        client_id="control-ui",
        client_mode="webchat",
        connected_at=timezone.now(),
    )
    assert two_phase(toolCallId="t2", runId="r2")["deliveryRoute"] == "approval-client"


def test_wait_decision_get_and_resolve_answers():
    approval_id = two_phase(ask="always", agentId="ops", warningText="deploys to production")["id"]
    got = wire(APPROVER, "exec.approval.get", {"id": approval_id})["payload"]
    row = ExecApproval.objects.get(pk=approval_id)
    assert got == {
        "id": approval_id,
        "commandText": "git push",
        "commandPreview": None,
        "allowedDecisions": ["allow-once", "deny"],
        "host": "gateway",
        "nodeId": None,
        "agentId": "ops",
        "expiresAtMs": int(row.expires_at.timestamp() * 1000),
    }
    assert row.request["warningText"] == "deploys to production"
    assert refusal(wire(APPROVER, "exec.approval.resolve", {"id": approval_id, "decision": "allow-always"})) == (
        "INVALID_REQUEST",
        "allow-always is unavailable for this command",
    )
    assert wire(APPROVER, "exec.approval.resolve", {"id": approval_id, "decision": "deny"})["payload"] == {"ok": True}
    assert wire(APPROVER, "exec.approval.resolve", {"id": approval_id, "decision": "deny"})["payload"] == {"ok": True}
    waited = wire(APPROVER, "exec.approval.waitDecision", {"id": approval_id})["payload"]
    assert waited == {
        "id": approval_id,
        "decision": "deny",
        "createdAtMs": int(row.created_at.timestamp() * 1000),
        "expiresAtMs": int(row.expires_at.timestamp() * 1000),
    }
    again = wire(APPROVER, "exec.approval.resolve", {"id": approval_id, "decision": "allow-once"})
    assert refusal(again) == ("INVALID_REQUEST", "approval already resolved")
    assert again["error"]["details"] == {"reason": "APPROVAL_ALREADY_RESOLVED"}
    # Decided: no longer pending for get and list.
    gone = wire(APPROVER, "exec.approval.get", {"id": approval_id})
    assert refusal(gone) == ("INVALID_REQUEST", "unknown or expired approval id")
    assert gone["error"]["details"] == NOT_FOUND_DETAILS
    assert wire(APPROVER, "exec.approval.list", {})["payload"] == []


def test_unknown_ids_and_bad_decisions_are_refused_with_nothing_written():
    approval_id = two_phase()["id"]
    before = world()
    unknown = wire(APPROVER, "exec.approval.resolve", {"id": "nope", "decision": "deny"})
    assert refusal(unknown) == ("INVALID_REQUEST", "unknown or expired approval id")
    assert unknown["error"]["details"] == NOT_FOUND_DETAILS
    assert refusal(wire(APPROVER, "exec.approval.resolve", {"id": approval_id, "decision": "approve"})) == (
        "INVALID_REQUEST",
        "invalid decision",
    )
    assert refusal(wire(APPROVER, "exec.approval.waitDecision", {"id": "nope"})) == (
        "INVALID_REQUEST",
        "approval expired or not found",
    )
    assert world() == before


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "command is required"),
        ({"command": ""}, "command is required"),
        ({"command": "x" * 9000}, "command exceeds exec approval display limit"),
        ({"command": "ls", "host": "node"}, "nodeId is required for host=node"),
        ({"command": "ls", "nodeId": "f" * 64}, "unknown nodeId"),
        ({"command": "ls", "id": "plugin:1"}, "approval ids starting with plugin: are reserved"),
        (
            {"command": "ls", "timeoutMs": 0},
            "invalid exec.approval.request params: at /timeoutMs: Input should be greater than or equal to 1",
        ),
        (
            {"command": "ls", "timeoutMs": 86_400_001},
            "invalid exec.approval.request params: at /timeoutMs: Input should be less than or equal to 86400000",
        ),
        (
            {"command": "ls", "host": "cloud"},
            "invalid exec.approval.request params: at /host: Input should be 'gateway' or 'node'",
        ),
        (
            {"command": "ls", "runPlan": {}},
            "invalid exec.approval.request params: at /runPlan: unexpected property",
        ),
        (
            {"command": "x" * 65537},
            "invalid exec.approval.request params: at /command: String should have at most 65536 characters",
        ),
        (
            {"command": "ls", "id": "i" * 201},
            "invalid exec.approval.request params: at /id: String should have at most 200 characters",
        ),
        ({"command": "ls\x00"}, "invalid exec.approval.request params: at /command: must not contain NUL characters"),
        (
            {"commandArgv": ["x" * 40_000, "y" * 40_000]},
            "invalid exec.approval.request params: at /commandArgv: at most 65536 characters in all",
        ),
    ],
)
def test_bad_requests_are_refused_with_nothing_written(params, message):
    before = world()
    assert refusal(wire(APPROVER, "exec.approval.request", {"twoPhase": True, **params})) == (
        "INVALID_REQUEST",
        message,
    )
    assert world() == before


def test_an_explicit_id_already_used_is_refused():
    two_phase(id="fixed")
    before = world()
    again = wire(APPROVER, "exec.approval.request", {"command": "ls", "id": "fixed", "twoPhase": True})
    assert refusal(again) == ("INVALID_REQUEST", "approval id already pending")
    assert world() == before


# --- history -------------------------------------------------------------------------------------------


def test_history_pages_newest_first_with_a_cursor_in_openclaws_shape():
    ids = [
        two_phase(runId="r", toolCallId=f"t{i}", agentId="main", sessionKey="agent:main:main")["id"] for i in range(4)
    ]
    for approval_id in ids[:3]:
        wire(APPROVER, "exec.approval.resolve", {"id": approval_id, "decision": "deny"})
    approvals_service.exec_approvals_cancel_for_run("r", "run-aborted")  # the fourth: withdrawn by its turn
    still_pending = two_phase(runId="r2", toolCallId="t-pending")["id"]

    first = wire(APPROVER, "approval.history", {"limit": 3})["payload"]
    second = wire(APPROVER, "approval.history", {"limit": 3, "cursor": first["nextCursor"]})["payload"]

    assert [a["id"] for a in first["items"]] + [a["id"] for a in second["items"]] == ids[::-1]
    assert "nextCursor" not in second and still_pending not in {a["id"] for a in first["items"]}
    cancelled, denied = first["items"][0], first["items"][1]
    row = ExecApproval.objects.get(pk=denied["id"])
    assert denied == {
        "id": row.pk,
        "urlPath": f"/approve/{row.pk}",
        "createdAtMs": int(row.created_at.timestamp() * 1000),
        "expiresAtMs": int(row.expires_at.timestamp() * 1000),
        "presentation": {
            "kind": "exec",
            "commandText": "git push",
            "commandPreview": None,
            "warningText": None,
            "host": "gateway",
            "nodeId": None,
            "agentId": "main",
            "allowedDecisions": ["allow-once", "allow-always", "deny"],
        },
        "resolvedAtMs": int(row.resolved_at.timestamp() * 1000),
        "status": "denied",
        "decision": "deny",
        "reason": "user",
        "source": {"agentId": "main", "sessionKey": "agent:main:main"},
        "resolver": {"kind": "device", "id": "approver-device"},
    }
    assert (cancelled["status"], cancelled["reason"], cancelled["resolver"]) == (
        "cancelled",
        "run-aborted",
        {"kind": "system"},
    )
    assert "decision" not in cancelled
    assert wire(APPROVER, "approval.history", {"kind": "plugin"})["payload"] == {"items": []}
    for cursor in ("garbage!", cursor_encode(2**62, "x")):  # not ours; past year 9999
        assert refusal(wire(APPROVER, "approval.history", {"cursor": cursor})) == (
            "INVALID_REQUEST",
            "invalid approval.history cursor",
        )
    assert refusal(wire(APPROVER, "approval.history", {"limit": 101}))[1].startswith(
        "invalid approval.history params: at /limit"
    )


# --- policy documents ----------------------------------------------------------------------------------


def test_the_gateways_document_get_and_compare_and_set():
    empty = wire(ADMIN, "exec.approvals.get", {})["payload"]
    assert empty == {
        "path": "openclaw-django:exec-approvals/gateway",
        "exists": False,
        "hash": "missing:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "file": {"version": 1, "defaults": {}, "agents": {}},
        "resolvedDefaults": {
            "security": "allowlist",
            "ask": "on-miss",
            "askFallback": "deny",
            "autoAllowSkills": False,
        },
    }
    document = {"version": 1, "defaults": {"security": "full"}, "agents": {"main": {"allowlist": [{"pattern": "ls"}]}}}
    stored = wire(ADMIN, "exec.approvals.set", {"file": document, "baseHash": empty["hash"]})["payload"]
    assert stored["exists"] is True and stored["resolvedDefaults"]["security"] == "full"
    assert stored["file"]["agents"]["main"]["allowlist"][0]["pattern"] == "ls"
    assert wire(ADMIN, "exec.approvals.get", {})["payload"] == stored

    before = world()
    assert refusal(wire(ADMIN, "exec.approvals.set", {"file": document})) == (
        "INVALID_REQUEST",
        "exec approvals base hash required; re-run exec.approvals.get and retry",
    )
    assert refusal(wire(ADMIN, "exec.approvals.set", {"file": document, "baseHash": empty["hash"]})) == (
        "INVALID_REQUEST",
        "exec approvals changed since last load; re-run exec.approvals.get and retry",
    )
    bad = wire(
        ADMIN,
        "exec.approvals.set",
        {
            "file": {"version": 1, "agents": {"main": {"allowlist": [{"pattern": "ls", "argPattern": "["}]}}},
            "baseHash": stored["hash"],
        },
    )
    assert refusal(bad)[1].startswith(
        "invalid exec approvals file: at /agents/main/allowlist/0/argPattern: not a valid"
    )
    assert bad["error"]["details"] == {"path": "/agents/main/allowlist/0/argPattern"}
    assert refusal(wire(ADMIN, "exec.approvals.set", {"file": "x"})) == (
        "INVALID_REQUEST",
        "invalid exec.approvals.set params: at /file: Input should be a valid dictionary",
    )
    assert world() == before


def test_a_nodes_document_is_kept_by_the_gateway_for_paired_nodes_only(node):
    got = wire(ADMIN, "exec.approvals.node.get", {"nodeId": NODE_ID})["payload"]
    assert got["path"] == f"openclaw-django:exec-approvals/node:{NODE_ID}" and got["exists"] is False
    stored = wire(
        ADMIN, "exec.approvals.node.set", {"nodeId": NODE_ID, "file": {"version": 1, "defaults": {"security": "deny"}}}
    )["payload"]
    assert stored["resolvedDefaults"]["security"] == "deny"
    assert ExecApprovalPolicy.objects.get(scope=f"node:{NODE_ID}").hash == stored["hash"]
    before = world()
    for method, params in (
        ("exec.approvals.node.get", {"nodeId": "f" * 64}),
        ("exec.approvals.node.set", {"nodeId": "f" * 64, "file": {"version": 1}}),
    ):
        assert refusal(wire(ADMIN, method, params)) == ("INVALID_REQUEST", "unknown nodeId")
    assert world() == before
