"""Exec approvals: asking, an operator's decision, expiry and cancellation.

An approval leaves ``pending`` exactly once, by compare-and-set on its status: the first answer wins, and
whatever comes second (a second operator, the expiry sweep, the turn giving up) finds it settled. Each
transition commits with its audit row; events and wake-ups go out after commit (``events.py``).
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from gateway.audit import Actor, audit
from gateway.exceptions import Conflict, InvalidRequest
from openclaw_client.agent import exec_policy

from .. import events
from ..models import ApprovalDecision, ApprovalStatus, ExecApproval
from ..selectors import (
    DISPLAY_LIMIT,
    approval_not_found,
    display_text,
    execution_scope,
    node_policy_scope,
)
from ..session_events import publish_session_approval_on_commit
from .policies import policy_entries_append

RESERVED_ID_PREFIX = "plugin:"
# Approvals the expiry sweep settles per run (the rest wait for the next one, 15 s later).
EXPIRE_BATCH = 500
TIMEOUT_REASON = "timeout"
EXPIRY_ACTOR = Actor.system("gateway:expiry")
ALLOW_ALWAYS_UNAVAILABLE_DETAILS = {"reason": "APPROVAL_ALLOW_ALWAYS_UNAVAILABLE"}


def default_timeout_ms() -> int:
    return settings.OPENCLAW_EXEC_APPROVAL_TIMEOUT_MS


@dataclass(frozen=True)
class _Asked:
    """A request checked and put in its stored form."""

    command: str
    argv: list[str] | None
    cwd: str
    host: str
    node_id: str
    request: dict[str, Any]


def _checked_request(
    *,
    command: str,
    argv: Sequence[str] | None,
    cwd: str | None,
    host: str | None,
    node_id: str | None,
    agent_id: str | None,
    session_key: str | None,
    session_id: str | None,
    run_id: str | None,
    tool_call_id: str | None,
    security: str | None,
    ask: str | None,
    warning_text: str | None,
    approval_id: str | None,
) -> _Asked:
    argv_list = [str(arg) for arg in argv] if argv else None
    text = command if command.strip() else (shlex.join(argv_list) if argv_list else "")
    if not text.strip():
        raise InvalidRequest("command is required")
    shown = display_text(text)
    if len(shown) > DISPLAY_LIMIT:
        raise InvalidRequest(
            "command exceeds exec approval display limit", details={"reason": "EXEC_APPROVAL_COMMAND_DISPLAY_LIMIT"}
        )
    if approval_id is not None and approval_id.startswith(RESERVED_ID_PREFIX):
        raise InvalidRequest(f"approval ids starting with {RESERVED_ID_PREFIX} are reserved")
    host = host or ("node" if node_id else "gateway")
    if host not in ("gateway", "node"):
        raise InvalidRequest("host must be gateway or node")
    if host == "node":
        if not node_id or not node_id.strip():
            raise InvalidRequest("nodeId is required for host=node")
        node_id = node_id.strip()
        node_policy_scope(node_id)  # a paired node, or NotFound: its document is where allow-always goes
    else:
        node_id = ""
    ask = ask if ask in exec_policy.ASK_LEVELS else None
    security = security if security in exec_policy.SECURITY_LEVELS else None
    # "Always allow here" needs a directory and a command the allowlist can match; ask=always never keeps one.
    can_keep = ask != "always" and bool(exec_policy.allow_always_entries(argv_list or text, cwd))
    allowed = list(exec_policy.DECISIONS) if can_keep else ["allow-once", "deny"]
    request = {
        "command": shown,
        "commandArgv": argv_list,
        "cwd": display_text(cwd) if cwd else None,
        "nodeId": node_id or None,
        "host": host,
        "security": security,
        "ask": ask,
        "agentId": agent_id or None,
        "sessionKey": session_key or None,
        "sessionId": session_id or None,
        "runId": run_id or None,
        "toolCallId": tool_call_id or None,
        "allowedDecisions": allowed,
        "warningText": warning_text or None,
    }
    return _Asked(command=text, argv=argv_list, cwd=cwd or "", host=host, node_id=node_id, request=request)


def exec_approval_request(
    *,
    command: str,
    argv: Sequence[str] | None,
    cwd: str | None,
    host: str | None,
    node_id: str | None,
    agent_id: str | None,
    session_key: str | None,
    session_id: str | None,
    run_id: str | None,
    tool_call_id: str | None,
    timeout_ms: int | None,
    requested_by: Actor,
    approval_id: str | None = None,
    security: str | None = None,
    ask: str | None = None,
    warning_text: str | None = None,
) -> ExecApproval:
    """Ask the operators about a command (``exec.approval.requested`` goes out after commit).

    Idempotent on (``run_id``, ``tool_call_id``): a retried tool step gets the approval it asked for
    before, pending or decided, and nobody is asked twice. ``argv``: the command's argv when it runs
    without a shell (else ``command`` is a shell command line). ``security``/``ask``: the policy that
    asks (shown to the operator; ``ask=always`` offers no allow-always). ``timeout_ms`` None: the
    ``OPENCLAW_EXEC_APPROVAL_TIMEOUT_MS`` setting.
    """
    asked = _checked_request(
        command=command,
        argv=argv,
        cwd=cwd,
        host=host,
        node_id=node_id,
        agent_id=agent_id,
        session_key=session_key,
        session_id=session_id,
        run_id=run_id,
        tool_call_id=tool_call_id,
        security=security,
        ask=ask,
        warning_text=warning_text,
        approval_id=approval_id,
    )
    keyed = bool(run_id and tool_call_id)
    now = timezone.now()
    fields = dict(
        command=asked.command,
        command_argv=asked.argv,
        cwd=asked.cwd,
        host=asked.host,
        node_id=asked.node_id,
        agent_id=agent_id or "",
        session_key=session_key or "",
        session_id=session_id or "",
        run_id=run_id or "",
        tool_call_id=tool_call_id or "",
        request=asked.request,
        requested_by=requested_by.label,
        requested_by_device=requested_by.device_id or "",
        requested_by_conn=requested_by.conn_id or "",
        created_at=now,
        expires_at=now + timedelta(milliseconds=timeout_ms or default_timeout_ms()),
    )
    with transaction.atomic():
        if keyed:
            existing = ExecApproval.objects.filter(run_id=run_id, tool_call_id=tool_call_id).first()
            if existing is not None:
                return existing
        if approval_id is not None and ExecApproval.objects.filter(pk=approval_id).exists():
            raise InvalidRequest("approval id already pending")
        try:
            # A savepoint: losing a race on (run, tool call) or on the id must leave the transaction usable.
            with transaction.atomic():
                approval = ExecApproval.objects.create(id=approval_id or str(uuid.uuid4()), **fields)
        except IntegrityError:
            existing = ExecApproval.objects.filter(run_id=run_id, tool_call_id=tool_call_id).first() if keyed else None
            if existing is not None:
                return existing
            raise InvalidRequest("approval id already pending") from None
        events.publish_requested_on_commit(approval)
        publish_session_approval_on_commit(approval)
    return approval


def _audit_data(approval: ExecApproval, **extra: Any) -> dict[str, Any]:
    """Who asked, about what, for which session: the audit row of every transition."""
    return {
        "command": approval.command[:2000],
        "cwd": approval.cwd,
        "host": approval.host,
        "nodeId": approval.node_id or None,
        "agentId": approval.agent_id or None,
        "sessionKey": approval.session_key or None,
        "sessionId": approval.session_id or None,
        "runId": approval.run_id or None,
        "toolCallId": approval.tool_call_id or None,
        "requestedBy": approval.requested_by,
        "before": ApprovalStatus.PENDING,
        "after": approval.status,
        **extra,
    }


def _repeated(approval: ExecApproval, decision: str) -> ExecApproval:
    """A decision on a decided approval: the same one is answered again, another refused (first answer wins)."""
    if approval.decision == decision:
        return approval
    raise Conflict("approval already resolved", details={"reason": "APPROVAL_ALREADY_RESOLVED"})


def exec_approval_resolve(*, approval_id: str, decision: str, actor: Actor) -> ExecApproval:
    """An operator's decision (``allow-once``, ``allow-always``, ``deny``) on a pending approval.

    Compare-and-set pending → approved | denied, and only while it has not expired (one past its expiry
    that the sweep has not reached yet is refused like an expired one). ``allow-always`` also adds the
    command's entries to the execution host's document, in the same transaction.
    """
    if decision not in exec_policy.DECISIONS:
        raise InvalidRequest("invalid decision")
    now = timezone.now()
    with transaction.atomic():
        approval = ExecApproval.objects.filter(pk=approval_id).first()
        if approval is None:
            raise approval_not_found()
        if approval.status in (ApprovalStatus.APPROVED, ApprovalStatus.DENIED):
            return _repeated(approval, decision)
        if approval.status != ApprovalStatus.PENDING or approval.expires_at <= now:
            raise approval_not_found()
        if decision not in (approval.request.get("allowedDecisions") or ()):
            raise InvalidRequest(
                "allow-always is unavailable for this command", details=dict(ALLOW_ALWAYS_UNAVAILABLE_DETAILS)
            )
        status = ApprovalStatus.DENIED if decision == ApprovalDecision.DENY else ApprovalStatus.APPROVED
        claimed = ExecApproval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING, expires_at__gt=now).update(
            status=status,
            decision=decision,
            resolved_by=actor.label,
            resolved_by_device=actor.device_id or "",
            resolved_at=now,
        )
        if claimed != 1:
            approval.refresh_from_db()
            if approval.status in (ApprovalStatus.APPROVED, ApprovalStatus.DENIED):
                return _repeated(approval, decision)
            raise approval_not_found()
        approval.status, approval.decision, approval.resolved_at = status, decision, now
        approval.resolved_by, approval.resolved_by_device = actor.label, actor.device_id or ""
        extra: dict[str, Any] = {"decision": decision}
        if decision == ApprovalDecision.ALLOW_ALWAYS:
            scope = execution_scope(approval)
            entries = exec_policy.allow_always_entries(
                approval.command_argv or approval.command, approval.cwd or None, now_ms=events.ms(now)
            )
            if not entries:  # the request offered allow-always, so its command was keepable then
                raise InvalidRequest(
                    "allow-always is unavailable for this command", details=dict(ALLOW_ALWAYS_UNAVAILABLE_DETAILS)
                )
            policy_entries_append(
                scope=scope,
                agent_id=approval.agent_id or exec_policy.DEFAULT_AGENT_ID,
                entries=entries,
                actor=actor,
                approval_id=approval.id,
            )
            extra["policyScope"] = scope
        audit(actor, "exec.approval.resolve", "exec_approval", approval.id, _audit_data(approval, **extra))
        events.publish_settled_on_commit(approval)
        publish_session_approval_on_commit(approval)
    return approval


def _settle(
    approval_id: str, *, status: str, reason: str, actor: Actor, now: datetime, due_only: bool
) -> ExecApproval | None:
    """Pending → expired | cancelled (no operator decided): None when it was not pending (or not due)."""
    with transaction.atomic():
        pending = ExecApproval.objects.filter(pk=approval_id, status=ApprovalStatus.PENDING)
        if due_only:
            pending = pending.filter(expires_at__lte=now)
        if pending.update(status=status, terminal_reason=reason[:64], resolved_at=now) != 1:
            return None
        approval = ExecApproval.objects.get(pk=approval_id)
        action = "exec.approval.expire" if status == ApprovalStatus.EXPIRED else "exec.approval.cancel"
        audit(actor, action, "exec_approval", approval.id, _audit_data(approval, reason=approval.terminal_reason))
        events.publish_settled_on_commit(approval)
        publish_session_approval_on_commit(approval)
    return approval


def exec_approval_expire(*, approval_id: str, now: datetime | None = None) -> ExecApproval | None:
    """Expire one approval if it is pending and past its expiry (a waiter that saw it overdue, or the sweep).

    ``askFallback`` is not applied here: the turn waiting for it applies its policy's fallback."""
    return _settle(
        approval_id,
        status=ApprovalStatus.EXPIRED,
        reason=TIMEOUT_REASON,
        actor=EXPIRY_ACTOR,
        now=now or timezone.now(),
        due_only=True,
    )


def exec_approvals_expire_due(now: datetime | None = None) -> int:
    """The expiry sweep (Celery beat; the gateway loop when embedded): overdue pending approvals → expired,
    one transaction each. Returns how many it expired."""
    now = now or timezone.now()
    due = list(
        ExecApproval.objects.filter(status=ApprovalStatus.PENDING, expires_at__lte=now)
        .order_by("expires_at")
        .values_list("pk", flat=True)[:EXPIRE_BATCH]
    )
    return sum(1 for approval_id in due if exec_approval_expire(approval_id=approval_id, now=now) is not None)


def exec_approval_cancel(*, approval_id: str, reason: str, actor: Actor | None = None) -> ExecApproval | None:
    """Withdraw a pending approval nobody decided (its turn ended or was aborted while it waited); the
    consoles drop it (``exec.approval.resolved`` with ``decision: null``). None when it was not pending."""
    return _settle(
        approval_id,
        status=ApprovalStatus.CANCELLED,
        reason=reason,
        actor=actor or Actor.system("gateway:turn"),
        now=timezone.now(),
        due_only=False,
    )


def exec_approvals_cancel_for_run(run_id: str, reason: str) -> int:
    """Withdraw every pending approval of a turn (it ended, or was aborted, while they waited)."""
    if not run_id:
        return 0
    pending = ExecApproval.objects.filter(run_id=run_id, status=ApprovalStatus.PENDING).values_list("pk", flat=True)
    actor = Actor.system(f"run:{run_id}"[:200])
    return sum(
        1 for approval_id in list(pending) if exec_approval_cancel(approval_id=approval_id, reason=reason, actor=actor)
    )
