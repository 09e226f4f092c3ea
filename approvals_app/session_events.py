"""``session.approval``: an exec approval of a session, requested or settled, to the connections that follow
that session's messages with ``includeApprovals`` (``sessions.messages.subscribe``), in OpenClaw's shape
(its ``operator-approval-session-events``): ``{sessionKey, updatedAtMs, phase: "pending" | "terminal",
approval}``, ``approval`` the reviewer-safe snapshot ``approval.history`` items have. Published after commit.

The subscription is keyed by the session (``gateway.events.keyed_subscription``): sessions_app subscribes
connections to :func:`session_approvals_subscription`, this app publishes to it.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

from django.db import transaction

from gateway import scopes as sc
from gateway.events import keyed_subscription, publish_to_subscription_rollback_unsafe
from gateway.registry import registry

from .events import ms
from .models import ApprovalStatus, ExecApproval
from .selectors import approval_presentation, history_item

SESSION_APPROVALS_FAMILY = "session.approvals"
EVENT_SESSION_APPROVAL = registry.event("session.approval", scope=sc.APPROVALS, subscription=SESSION_APPROVALS_FAMILY)
# OpenClaw's replay carries at most this many pending approvals (MAX_SESSION_APPROVAL_REPLAY).
MAX_REPLAY = 1000


def session_approvals_subscription(session_key: str) -> str:
    return keyed_subscription(SESSION_APPROVALS_FAMILY, session_key)


def pending_snapshot(approval: ExecApproval) -> dict[str, Any]:
    """OpenClaw's pending approval snapshot: what a reviewer may see of an approval still waiting."""
    return {
        "id": approval.id,
        "status": "pending",
        "presentation": approval_presentation(approval),
        "urlPath": "/approve/" + quote(approval.id, safe=""),
        "createdAtMs": ms(approval.created_at),
        "expiresAtMs": ms(approval.expires_at),
    }


def session_approval_payload(approval: ExecApproval) -> dict[str, Any]:
    pending = approval.status == ApprovalStatus.PENDING
    return {
        "sessionKey": approval.session_key,
        "updatedAtMs": ms(approval.resolved_at) if approval.resolved_at else ms(approval.created_at),
        "phase": "pending" if pending else "terminal",
        "approval": pending_snapshot(approval) if pending else history_item(approval),
    }


def publish_session_approval_on_commit(approval: ExecApproval) -> None:
    """The approval as it now stands, to its session's approval subscribers (none for a session-less one)."""
    if not approval.session_key:
        return
    payload = session_approval_payload(approval)
    subscription = session_approvals_subscription(approval.session_key)
    transaction.on_commit(
        lambda: publish_to_subscription_rollback_unsafe(subscription, EVENT_SESSION_APPROVAL, payload)
    )


def session_approval_replay(session_key: str) -> dict[str, Any]:
    """The session's approvals still waiting, oldest first: OpenClaw's ``approvalReplay`` of a subscribe."""
    pending = list(
        ExecApproval.objects.filter(session_key=session_key, status=ApprovalStatus.PENDING).order_by(
            "created_at", "id"
        )[: MAX_REPLAY + 1]
    )
    return {
        "sessionKey": session_key,
        "updatedAtMs": int(time.time() * 1000),
        "approvals": [pending_snapshot(approval) for approval in pending[:MAX_REPLAY]],
        "truncated": len(pending) > MAX_REPLAY,
    }
