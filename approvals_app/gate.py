"""A turn's exec gate: the exec policy's verdict on each command the agent wants to run, and an operator's
decision when the policy asks (``sessions_app/turns.py`` for turns the gateway runs,
``workers_app/services/worker_turns.py`` for the questions of a turn run on a node).

One gate per turn. :meth:`ExecGate.decide` answers with an :class:`ExecDecision` (the agent loop's
``Approval``: ``allowed``, ``reason``, ``aborted``); :meth:`ExecGate.close` withdraws whatever the turn
still has pending when it ends.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from gateway.audit import Actor
from gateway.background import release_database_connections
from gateway.exceptions import GatewayError
from openclaw_client.agent import exec_policy
from openclaw_client.agent.exec_policy import Which

from .models import ApprovalStatus, ExecApproval
from .selectors import effective_exec_policy
from .services.approvals import exec_approval_cancel, exec_approval_request, exec_approvals_cancel_for_run
from .services.waiting import exec_approval_wait

# Why a turn withdraws an approval nobody decided (OpenClaw's reason of a cancelled approval): it stopped
# waiting, or it ended with one still pending (which only an abort, a lost run or a failure leaves behind).
ABORTED_REASON = "run-aborted"
# The wait outlives the approval's expiry by this much: the waiter expires it itself at its expiry.
EXPIRY_MARGIN_S = 1.0
MAX_ENV_KEYS_SHOWN = 20


def _nowhere(_name: str) -> str | None:
    return None


@dataclass(frozen=True)
class ExecDecision:
    """Run the command, or answer the model with ``reason`` as the tool's error (``aborted``: the turn was
    stopped while it waited, so the loop stops too)."""

    allowed: bool
    reason: str = ""
    aborted: bool = False
    approval_id: str | None = None


class ExecGate:
    def __init__(
        self,
        *,
        agent_id: str | None,
        node_id: str | None,
        session_key: str | None,
        session_id: str | None,
        run_id: str,
        which: Which | None = None,
    ):
        self.agent_id = agent_id or exec_policy.DEFAULT_AGENT_ID
        self.node_id = node_id or None
        self.session_key = session_key
        self.session_id = session_id
        self.run_id = run_id
        # Bare command names are looked up on this host's PATH for a turn run here. A node's PATH is not
        # known to the gateway: a bare name matches only bare-name entries there (never a path pattern).
        self.which: Which = which or (_nowhere if self.node_id else shutil.which)
        # Whether this turn asked operators anything: a turn that never did has nothing to withdraw (and
        # reads nothing when it ends, so a waiting node turn keeps no database connection for it).
        self.asked = False

    def decide(self, call_id: str, request: Any, *, should_stop: Callable[[], bool]) -> ExecDecision:
        """The decision on ``request`` (an ``ExecRequest``: ``command``, a shell command line, run in
        ``workdir``) for the tool call ``call_id``; waits for an operator when the policy asks, until the
        approval expires (then ``askFallback`` decides) or ``should_stop()`` (the turn was aborted)."""
        command: str = request.command
        cwd: str | None = getattr(request, "workdir", None) or None
        policy = effective_exec_policy(self.agent_id, self.node_id)
        verdict = exec_policy.evaluate(policy, command, cwd, which=self.which)
        if verdict.decision == "allow":
            return ExecDecision(True)
        if verdict.decision == "deny":
            return ExecDecision(False, f"exec denied: {verdict.reason}")
        try:
            approval = self._ask(call_id, command, cwd, policy, request)
        except GatewayError as error:
            # Nothing an operator could be shown (a command past the display limit, a node no longer
            # paired): the command does not run, and the model is told why.
            return ExecDecision(False, f"exec not run: {error.message}")
        release_database_connections()
        wait_s = (approval.expires_at - timezone.now()).total_seconds() + EXPIRY_MARGIN_S
        settled = exec_approval_wait(approval.id, timeout_s=wait_s, should_stop=should_stop)
        if settled.status == ApprovalStatus.PENDING:
            withdrawn = exec_approval_cancel(approval_id=settled.id, reason=ABORTED_REASON)
            if withdrawn is not None or should_stop():
                return ExecDecision(
                    False, "not run: the turn was stopped while the command waited for approval", True, settled.id
                )
            # Decided (or expired) just before the withdrawal: that outcome stands.
            settled = exec_approval_wait(settled.id, timeout_s=EXPIRY_MARGIN_S, should_stop=lambda: False)
        return self._outcome(settled, policy, command, cwd)

    def _ask(
        self, call_id: str, command: str, cwd: str | None, policy: exec_policy.Policy, request: Any
    ) -> ExecApproval:
        self.asked = True
        return exec_approval_request(
            command=command,
            argv=None,
            cwd=cwd,
            host="node" if self.node_id else "gateway",
            node_id=self.node_id,
            agent_id=self.agent_id,
            session_key=self.session_key,
            session_id=self.session_id,
            run_id=self.run_id,
            tool_call_id=call_id,
            timeout_ms=None,
            requested_by=Actor(label=f"run:{self.run_id}"[:200], scopes=()),
            security=policy.security,
            ask=policy.ask,
            warning_text=_env_warning(getattr(request, "env_keys", ())),
        )

    def _outcome(
        self, approval: ExecApproval, policy: exec_policy.Policy, command: str, cwd: str | None
    ) -> ExecDecision:
        if approval.status == ApprovalStatus.APPROVED:
            return ExecDecision(True, approval_id=approval.id)
        if approval.status == ApprovalStatus.DENIED:
            return ExecDecision(False, "exec denied by an operator", approval_id=approval.id)
        if approval.status == ApprovalStatus.EXPIRED:
            fallback = exec_policy.fallback_verdict(policy, command, cwd, which=self.which)
            reason = "" if fallback.decision == "allow" else f"exec denied: {fallback.reason}"
            return ExecDecision(fallback.decision == "allow", reason, approval_id=approval.id)
        # Cancelled: the turn (a previous attempt of this step) withdrew it; it was never decided.
        return ExecDecision(
            False, "exec not run: its approval was withdrawn before a decision", approval_id=approval.id
        )

    def close(self) -> None:
        """The turn ended: withdraw its approvals nobody decided (the consoles drop them)."""
        if self.asked:
            exec_approvals_cancel_for_run(self.run_id, ABORTED_REASON)


def _env_warning(env_keys: Any) -> str | None:
    keys = sorted({str(key) for key in env_keys or ()})
    if not keys:
        return None
    shown = ", ".join(keys[:MAX_ENV_KEYS_SHOWN]) + (" …" if len(keys) > MAX_ENV_KEYS_SHOWN else "")
    return f"runs with these environment variables set by the agent: {shown}"
