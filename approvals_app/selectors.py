"""Reads of exec policies and approvals, and their wire projections."""

from __future__ import annotations

import unicodedata
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from django.db.models import QuerySet
from django.utils import timezone

from devices_app.models import PairedDevice
from gateway import scopes as sc
from gateway.cursors import cursor_decode, cursor_encode, cursor_int, cursor_str
from gateway.exceptions import InvalidRequest, NotFound
from gateway.selectors import live_connections
from openclaw_client.agent import exec_policy
from openclaw_client.agent.exec_policy import Policy

from .events import ms
from .models import GATEWAY_SCOPE, NODE_SCOPE_PREFIX, ApprovalStatus, ExecApproval, ExecApprovalPolicy, node_scope

# What an operator is shown of a command at most (OpenClaw refuses longer ones as well; its limit is 16 KiB).
DISPLAY_LIMIT = 8 * 1024
# Where a scope's document lives, as exec.approvals.get's ``path`` says (no file: a database row).
POLICY_PATH_PREFIX = "openclaw-django:exec-approvals/"

APPROVAL_NOT_FOUND_DETAILS = {
    "reason": "APPROVAL_NOT_FOUND",
    "remediation": "Re-request the action; pending approvals are cleared after expiry or restart.",
}


def approval_not_found() -> NotFound:
    return NotFound("unknown or expired approval id", details=dict(APPROVAL_NOT_FOUND_DETAILS))


# --- policies -----------------------------------------------------------------------------------------


def node_policy_scope(node_id: str) -> str:
    """The scope of a paired node's document; an id that is not a paired node is refused."""
    node_id = node_id.strip()
    if not node_id or not PairedDevice.objects.filter(device_id=node_id, is_node=True).exists():
        raise NotFound("unknown nodeId")
    return node_scope(node_id)


def policy_row(scope: str) -> ExecApprovalPolicy | None:
    return ExecApprovalPolicy.objects.filter(scope=scope).first()


def policy_document(scope: str) -> dict[str, Any] | None:
    row = policy_row(scope)
    return row.document if row is not None else None


def exec_policy_payload(scope: str, row: ExecApprovalPolicy | None) -> dict[str, Any]:
    """``exec.approvals.get`` / ``exec.approvals.node.get``: ``{path, exists, hash, file, resolvedDefaults}``."""
    document = row.document if row is not None else None
    return {
        "path": POLICY_PATH_PREFIX + scope,
        "exists": row is not None,
        "hash": row.hash if row is not None else exec_policy.MISSING_DOCUMENT_HASH,
        "file": document if document is not None else exec_policy.empty_document(),
        "resolvedDefaults": exec_policy.resolved_defaults(document),
    }


def exec_policy_snapshot(scope: str) -> dict[str, Any]:
    return exec_policy_payload(scope, policy_row(scope))


def effective_exec_policy(agent_id: str | None, node_id: str | None = None) -> Policy:
    """The policy an agent's command is judged by: the gateway's document alone for a command run by the
    gateway; for one run on a node, the stricter of the gateway's and the node's, with the node's allowlist."""
    documents = dict(
        ExecApprovalPolicy.objects.filter(
            scope__in=[GATEWAY_SCOPE, *([node_scope(node_id)] if node_id else [])]
        ).values_list("scope", "document")
    )
    gateway_policy = exec_policy.resolved_policy(documents.get(GATEWAY_SCOPE), agent_id)
    if not node_id:
        return gateway_policy
    node_policy = exec_policy.resolved_policy(documents.get(node_scope(node_id)), agent_id)
    return exec_policy.combine(gateway_policy, node_policy)


def execution_scope(approval: ExecApproval) -> str:
    """The document an allow-always decision extends: the execution host's."""
    return node_scope(approval.node_id) if approval.host == "node" and approval.node_id else GATEWAY_SCOPE


def scope_label(scope: str) -> str:
    return f"node {scope.removeprefix(NODE_SCOPE_PREFIX)}" if scope.startswith(NODE_SCOPE_PREFIX) else scope


# --- approvals ---------------------------------------------------------------------------------------


def display_text(text: str) -> str:
    """A command as an operator is shown it: invisible and control characters (a newline too) written as
    ``\\u{XXXX}``, so what looks harmless cannot hide what runs."""
    return "".join(f"\\u{{{ord(ch):X}}}" if _invisible(ch) else ch for ch in text)


_INVISIBLE_SPACES = frozenset("\u00a0\u1680\u202f\u205f\u3000\u115f\u1160\u3164\uffa0") | frozenset(
    chr(cp) for cp in range(0x2000, 0x200B)
)


def _invisible(ch: str) -> bool:
    return unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp") or ch in _INVISIBLE_SPACES


def approval_get(approval_id: str) -> ExecApproval | None:
    return ExecApproval.objects.filter(pk=approval_id).first()


def pending_approvals() -> QuerySet[ExecApproval]:
    """Approvals still waiting for a decision (overdue ones the sweep has not expired yet are left out)."""
    return ExecApproval.objects.filter(status=ApprovalStatus.PENDING, expires_at__gt=timezone.now())


def pending_approval_require(approval_id: str) -> ExecApproval:
    approval = pending_approvals().filter(pk=approval_id).first()
    if approval is None:
        raise approval_not_found()
    return approval


def settled_approvals(*, limit: int) -> list[ExecApproval]:
    """The newest decided, expired or cancelled approvals (``exec_approval_history_idx``)."""
    return list(ExecApproval.objects.filter(resolved_at__isnull=False).order_by("-resolved_at", "-id")[:limit])


def approval_list_item(approval: ExecApproval) -> dict[str, Any]:
    """One entry of ``exec.approval.list`` (OpenClaw's shape)."""
    return {
        "id": approval.id,
        "request": approval.request,
        "createdAtMs": ms(approval.created_at),
        "expiresAtMs": ms(approval.expires_at),
        "approvalKind": "exec",
    }


def approval_list() -> list[dict[str, Any]]:
    return [approval_list_item(a) for a in pending_approvals().order_by("created_at", "id")]


def approval_get_payload(approval: ExecApproval) -> dict[str, Any]:
    """``exec.approval.get``: what an operator needs to decide."""
    request = approval.request
    return {
        "id": approval.id,
        "commandText": request.get("command") or display_text(approval.command),
        "commandPreview": None,
        "allowedDecisions": list(request.get("allowedDecisions") or []),
        "host": request.get("host"),
        "nodeId": request.get("nodeId"),
        "agentId": request.get("agentId"),
        "expiresAtMs": ms(approval.expires_at),
    }


def approval_decision(approval: ExecApproval) -> str | None:
    """The decision a waiter is answered: an operator's, or None (expired, cancelled, still pending)."""
    if approval.status in (ApprovalStatus.APPROVED, ApprovalStatus.DENIED):
        return approval.decision
    return None


def wait_payload(approval: ExecApproval) -> dict[str, Any]:
    """``exec.approval.waitDecision``: ``{id, decision, createdAtMs, expiresAtMs, terminalReason?}``."""
    payload: dict[str, Any] = {
        "id": approval.id,
        "decision": approval_decision(approval),
        "createdAtMs": ms(approval.created_at),
        "expiresAtMs": ms(approval.expires_at),
    }
    if approval.terminal_reason:
        payload["terminalReason"] = approval.terminal_reason
    return payload


def request_decided_payload(approval: ExecApproval) -> dict[str, Any]:
    """``exec.approval.request`` once decided: ``{id, decision, createdAtMs, expiresAtMs}``."""
    return {
        "id": approval.id,
        "decision": approval_decision(approval),
        "createdAtMs": ms(approval.created_at),
        "expiresAtMs": ms(approval.expires_at),
    }


def delivery_route(*, exclude_conn_id: str | None = None) -> str:
    """``deliveryRoute`` of a two-phase request: ``approval-client`` when an operator connection that may
    decide is live (other than the requester's), else ``none`` (it stays pending until it expires)."""
    rows = live_connections().filter(role=sc.ROLE_OPERATOR)
    try:
        rows = rows.exclude(conn_id=uuid.UUID(exclude_conn_id)) if exclude_conn_id else rows
    except ValueError:
        pass  # not a registered connection's id (an in-process caller): nothing to leave out
    for scopes in rows.values_list("scopes", flat=True).iterator():
        if sc.scope_satisfied(scopes or [], sc.APPROVALS):
            return "approval-client"
    return "none"


# --- history ---------------------------------------------------------------------------------------


# OpenClaw's reasons of a cancelled approval; another reason a turn gave is reported as run-aborted.
CANCELLED_REASONS = ("run-aborted", "gateway-restart")
HISTORY_STATUS = {
    ApprovalStatus.APPROVED: "allowed",
    ApprovalStatus.DENIED: "denied",
    ApprovalStatus.EXPIRED: "expired",
    ApprovalStatus.CANCELLED: "cancelled",
}
INVALID_HISTORY_CURSOR = "invalid approval.history cursor"


def approval_presentation(approval: ExecApproval) -> dict[str, Any]:
    """What a reviewer is shown of an approval, as OpenClaw's approval ledger keeps it (no cwd or argv)."""
    request = approval.request
    return {
        "kind": "exec",
        "commandText": request.get("command") or display_text(approval.command),
        "commandPreview": None,
        "warningText": request.get("warningText"),
        "host": request.get("host"),
        "nodeId": request.get("nodeId"),
        "agentId": request.get("agentId"),
        "allowedDecisions": list(request.get("allowedDecisions") or []),
    }


def history_item(approval: ExecApproval) -> dict[str, Any]:
    """One settled approval as OpenClaw's ``approval.history`` item (its terminal approval snapshot)."""
    item: dict[str, Any] = {
        "id": approval.id,
        "urlPath": "/approve/" + quote(approval.id, safe=""),
        "createdAtMs": ms(approval.created_at),
        "expiresAtMs": ms(approval.expires_at),
        "presentation": approval_presentation(approval),
        "resolvedAtMs": ms(approval.resolved_at) if approval.resolved_at else ms(approval.expires_at),
        "status": HISTORY_STATUS[approval.status],
    }
    source = {
        key: value for key, value in (("agentId", approval.agent_id), ("sessionKey", approval.session_key)) if value
    }
    if source:
        item["source"] = source
    if approval.status in (ApprovalStatus.APPROVED, ApprovalStatus.DENIED):
        item["decision"] = approval.decision
        item["reason"] = "user"
        if approval.resolved_by_device:
            item["resolver"] = {"kind": "device", "id": approval.resolved_by_device}
        else:
            item["resolver"] = {"kind": "runtime", **({"id": approval.resolved_by} if approval.resolved_by else {})}
    elif approval.status == ApprovalStatus.EXPIRED:
        item["reason"] = "timeout"
        item["resolver"] = {"kind": "system"}
    else:
        reason = approval.terminal_reason
        item["reason"] = reason if reason in CANCELLED_REASONS else "run-aborted"
        item["resolver"] = {"kind": "system"}
    return item


def approval_history(*, limit: int, cursor: str | None, kind: str | None = None) -> dict[str, Any]:
    """``approval.history``: settled approvals, newest first, ``limit`` a page, OpenClaw's ``{items,
    nextCursor?}``; ``nextCursor`` continues after the last one. Only exec approvals exist here."""
    if cursor:
        try:
            at_us, last_id = cursor_decode(cursor, cursor_int, cursor_str)
            at = EPOCH + timedelta(microseconds=at_us)
        except (InvalidRequest, OverflowError):  # not one of ours, or a forged one past year 9999
            raise InvalidRequest(INVALID_HISTORY_CURSOR) from None
    if kind not in (None, "exec"):
        return {"items": []}
    rows = ExecApproval.objects.filter(resolved_at__isnull=False).order_by("-resolved_at", "-id")
    if cursor:
        rows = rows.filter(resolved_at__lte=at).exclude(resolved_at=at, id__gte=last_id)
    page = list(rows[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    history: dict[str, Any] = {"items": [history_item(a) for a in page]}
    if more and page:
        last = page[-1]
        history["nextCursor"] = cursor_encode(_micros(last.resolved_at), last.id)
    return history


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _micros(value: datetime) -> int:
    # Exact (a float timestamp would round the microseconds the keyset compares on).
    return (value - EPOCH) // timedelta(microseconds=1)
