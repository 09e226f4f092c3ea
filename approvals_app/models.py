"""Exec policy documents (one per scope) and exec approvals (one per command an operator is asked about)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

GATEWAY_SCOPE = "gateway"
NODE_SCOPE_PREFIX = "node:"


def node_scope(node_id: str) -> str:
    return f"{NODE_SCOPE_PREFIX}{node_id}"


class ExecApprovalPolicy(models.Model):
    """The exec approvals document of one scope: the gateway's own (``gateway``) or a paired node's
    (``node:<deviceId>``). Changed only by compare-and-set on ``hash`` (``exec.approvals.set``'s baseHash)."""

    scope = models.CharField(primary_key=True, max_length=200)
    # Normalized by openclaw_client.agent.exec_policy.normalize_document before it is stored.
    document = models.JSONField()
    # sha256 of the document's canonical JSON: the compare-and-set token clients send back.
    hash = models.CharField(max_length=64)
    updated_at = models.DateTimeField()
    updated_by = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["scope"]
        verbose_name = "exec approval policy"
        verbose_name_plural = "exec approval policies"

    def __str__(self) -> str:
        return f"exec policy of {self.scope}"


class ApprovalStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class ApprovalDecision(models.TextChoices):
    ALLOW_ONCE = "allow-once"
    ALLOW_ALWAYS = "allow-always"
    DENY = "deny"


TERMINAL_STATUSES = (ApprovalStatus.APPROVED, ApprovalStatus.DENIED, ApprovalStatus.EXPIRED, ApprovalStatus.CANCELLED)


class ExecApproval(models.Model):
    """One command waiting for (or decided by) an operator. Leaves ``pending`` once, by compare-and-set:
    to ``approved``/``denied`` (an operator), ``expired`` (nobody in time) or ``cancelled`` (its turn ended)."""

    id = models.CharField(primary_key=True, max_length=200)
    status = models.CharField(max_length=16, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING)
    decision = models.CharField(max_length=16, choices=ApprovalDecision.choices, blank=True)
    # The command as asked (the request's ``command`` is its display form), and its argv when it runs
    # without a shell.
    command = models.TextField()
    command_argv = models.JSONField(null=True, blank=True)
    cwd = models.TextField(blank=True)
    host = models.CharField(max_length=16)
    node_id = models.CharField(max_length=200, blank=True)
    agent_id = models.CharField(max_length=200, blank=True)
    session_key = models.CharField(max_length=300, blank=True)
    session_id = models.CharField(max_length=200, blank=True)
    run_id = models.CharField(max_length=200, blank=True)
    tool_call_id = models.CharField(max_length=200, blank=True)
    # The wire ``request`` object, as exec.approval.requested / list / resolved carry it.
    request = models.JSONField()
    requested_by = models.CharField(max_length=200)
    requested_by_device = models.CharField(max_length=64, blank=True)
    requested_by_conn = models.CharField(max_length=64, blank=True)
    resolved_by = models.CharField(max_length=200, blank=True)
    resolved_by_device = models.CharField(max_length=64, blank=True)
    # Why it ended without an operator's decision: "timeout", or the reason its turn gave when cancelling.
    terminal_reason = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # A retried tool step asks once: exec_approval_request returns the row of (run, tool call).
            models.UniqueConstraint(
                fields=["run_id", "tool_call_id"],
                condition=~Q(run_id="") & ~Q(tool_call_id=""),
                name="one_exec_approval_per_tool_call",
            ),
        ]
        indexes = [
            # exec.approval.list and the expiry sweep: pending approvals by expiry.
            models.Index(fields=["expires_at"], condition=Q(status="pending"), name="exec_approval_pending_idx"),
            # exec_approvals_cancel_for_run: a turn's approvals.
            models.Index(fields=["run_id"], condition=~Q(run_id=""), name="exec_approval_run_idx"),
            # approval.history: decided approvals, newest first (keyset on resolved_at, id).
            models.Index(
                fields=["-resolved_at", "-id"], condition=Q(resolved_at__isnull=False), name="exec_approval_history_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"exec approval {self.id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status != ApprovalStatus.PENDING
