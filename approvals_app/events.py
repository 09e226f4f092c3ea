"""Events of exec approvals, to operators holding ``operator.approvals`` (dropped for a slow one, as OpenClaw
does), and the notifications that wake whoever waits for a decision; all published after commit.

* ``exec.approval.requested {approvalKind: "exec", id, request, createdAtMs, expiresAtMs}``
* ``exec.approval.resolved {id, decision, resolvedBy, ts, request}`` — an operator's decision; also when an
  approval expires or its turn cancels it, then with ``decision: null``, ``resolvedBy: null`` and
  ``terminalReason`` (``"timeout"``, or the turn's reason), so every console drops the card.

A settled approval also wakes its waiters: ``exec.approval.waitDecision`` / ``exec.approval.request`` callers
in every gateway process (a process notification, :data:`APPROVAL_SETTLED`), and synchronous waiters
(turns) through a flag in Django's cache, which they read every 50 ms instead of the database.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

from django.core.cache import cache
from django.db import transaction

from gateway import scopes as sc
from gateway import state
from gateway.events import PublicationBatch
from gateway.registry import registry

from .models import ApprovalStatus, ExecApproval

EVENT_EXEC_APPROVAL_REQUESTED = registry.event("exec.approval.requested", scope=sc.APPROVALS)
EVENT_EXEC_APPROVAL_RESOLVED = registry.event("exec.approval.resolved", scope=sc.APPROVALS)

logger = logging.getLogger(__name__)

APPROVAL_SETTLED = "approvals.settled"
# How long the settled flag stays: a waiter reads the row itself when it starts, so the flag only has to
# outlive the waiters already waiting (which see it within 50 ms).
SETTLED_FLAG_TTL_S = 3600


def ms(value) -> int:
    return int(value.timestamp() * 1000)


def settled_cache_key(approval_id: str) -> str:
    # Hashed: an approval id is caller-chosen text (spaces, any characters) and cache keys must be plain.
    return "approvals:settled:" + hashlib.sha256(approval_id.encode("utf-8")).hexdigest()[:40]


def requested_payload(approval: ExecApproval) -> dict[str, Any]:
    return {
        "approvalKind": "exec",
        "id": approval.id,
        "request": approval.request,
        "createdAtMs": ms(approval.created_at),
        "expiresAtMs": ms(approval.expires_at),
    }


def resolved_payload(approval: ExecApproval) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "id": approval.id,
        "decision": approval.decision or None,
        "resolvedBy": approval.resolved_by or None,
        "ts": ms(approval.resolved_at) if approval.resolved_at else int(time.time() * 1000),
        "request": approval.request,
    }
    if approval.status in (ApprovalStatus.EXPIRED, ApprovalStatus.CANCELLED):
        payload["terminalReason"] = approval.terminal_reason or approval.status
    return payload


def publish_requested_on_commit(approval: ExecApproval) -> None:
    payload = requested_payload(approval)

    def publish() -> None:
        batch = PublicationBatch()
        batch.publish(EVENT_EXEC_APPROVAL_REQUESTED, payload, drop_if_slow=True)
        batch.post(what=f"{EVENT_EXEC_APPROVAL_REQUESTED} {approval.id}")

    transaction.on_commit(publish)


def publish_settled_on_commit(approval: ExecApproval) -> None:
    """The approval left ``pending``: tell the operators, wake every waiter."""
    payload = resolved_payload(approval)
    approval_id, status = approval.id, approval.status

    def publish() -> None:
        try:
            cache.set(settled_cache_key(approval_id), status, SETTLED_FLAG_TTL_S)
        except Exception:
            # The decision is committed; a waiter that misses the flag reads it within a second anyway.
            logger.warning("could not flag exec approval %s as settled in the cache", approval_id, exc_info=True)
        batch = PublicationBatch()
        batch.publish(EVENT_EXEC_APPROVAL_RESOLVED, payload, drop_if_slow=True)
        # After the event: a caller woken by it answers after the operators heard of the decision.
        batch.group_send(state.PROCESS_GROUP, {"type": APPROVAL_SETTLED, "id": approval_id, "status": status})
        batch.post(what=f"{EVENT_EXEC_APPROVAL_RESOLVED} {approval_id}")

    transaction.on_commit(publish)


def settled_flag(approval_id: str) -> str | None:
    """The status a settled approval's flag carries (None: not settled, or the flag expired)."""
    return cache.get(settled_cache_key(approval_id))
