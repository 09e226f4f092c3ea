"""A turn's exec gate (what the agent loop's ``approve_exec`` calls): the policy allows or denies outright, or an
operator decides while the turn waits; an expiry falls back to askFallback; a stopped turn withdraws its
approval; a retried step gets the decision it had; a node's commands are judged by both documents."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest
from django.db import connection

from approvals_app.gate import ExecDecision, ExecGate
from approvals_app.models import ExecApproval, ExecApprovalPolicy, node_scope
from approvals_app.services import approvals, policies
from gateway.audit import Actor
from openclaw_client.agent import exec_policy

from .conftest import CWD, NODE_ID

pytestmark = pytest.mark.django_db(transaction=True)

OPERATOR = Actor(label="device:op")


@dataclass(frozen=True)
class ExecRequest:
    """The fields of the tools' ExecRequest the gate reads."""

    command: str
    workdir: str = CWD
    env_keys: tuple[str, ...] = ()


def gate(node_id: str | None = None, **overrides) -> ExecGate:
    fields = dict(agent_id="main", node_id=node_id, session_key="agent:main:main", session_id="w1", run_id="run-1")
    fields.update(overrides)
    return ExecGate(**fields)


def set_policy(document: dict, scope: str = "gateway") -> None:
    current = ExecApprovalPolicy.objects.filter(scope=scope).values_list("hash", flat=True).first()
    policies.exec_policy_set(scope=scope, file=document, base_hash=current, actor=OPERATOR)


def answer_when_asked(decision: str, *, call_id: str = "call-1") -> threading.Thread:
    """An operator who decides as soon as the approval shows up."""

    def run() -> None:
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                approval = ExecApproval.objects.filter(tool_call_id=call_id, status="pending").first()
                if approval is not None:
                    approvals.exec_approval_resolve(approval_id=approval.pk, decision=decision, actor=OPERATOR)
                    return
                time.sleep(0.02)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def never() -> bool:
    return False


def test_the_policy_allows_or_denies_without_asking(published):
    set_policy({"version": 1, "agents": {"main": {"allowlist": [{"pattern": "ls"}]}, "locked": {"security": "deny"}}})
    assert gate().decide("call-1", ExecRequest("ls -la"), should_stop=never) == ExecDecision(True)
    denied = gate(agent_id="locked").decide("call-2", ExecRequest("ls"), should_stop=never)
    assert denied == ExecDecision(False, "exec denied: security=deny: the exec policy denies every command")
    set_policy({"version": 1, "defaults": exec_policy.MODES["allowlist"]})
    missed = gate().decide("call-3", ExecRequest("rm -rf build"), should_stop=never)
    assert missed == ExecDecision(False, "exec denied: not on the allowlist (ask=off)")
    assert not ExecApproval.objects.exists()
    assert published == []


def test_a_miss_waits_for_an_operator_who_allows_it(published):
    operator = answer_when_asked("allow-once")
    decision = gate().decide("call-1", ExecRequest("make deploy", env_keys=("TOKEN", "DEBUG")), should_stop=never)
    operator.join()
    approval = ExecApproval.objects.get()
    assert decision == ExecDecision(True, approval_id=approval.pk)
    assert (approval.run_id, approval.tool_call_id, approval.session_key, approval.host) == (
        "run-1",
        "call-1",
        "agent:main:main",
        "gateway",
    )
    assert (approval.request["security"], approval.request["ask"]) == ("allowlist", "on-miss")
    assert approval.request["warningText"] == "runs with these environment variables set by the agent: DEBUG, TOKEN"
    assert approval.requested_by == "run:run-1"
    assert published.names() == ["exec.approval.requested", "exec.approval.resolved"]


def test_an_operators_deny_is_the_tools_error(published):
    operator = answer_when_asked("deny")
    decision = gate().decide("call-1", ExecRequest("make deploy"), should_stop=never)
    operator.join()
    assert (decision.allowed, decision.reason, decision.aborted) == (False, "exec denied by an operator", False)


def test_allow_always_lets_the_same_command_in_the_same_directory_run_next_time(published):
    operator = answer_when_asked("allow-always")
    assert gate().decide("call-1", ExecRequest("make deploy"), should_stop=never).allowed
    operator.join()
    assert gate().decide("call-2", ExecRequest("make deploy"), should_stop=never) == ExecDecision(True)
    assert ExecApproval.objects.count() == 1


@pytest.mark.parametrize(("fallback", "allowed"), [("deny", False), ("full", True)])
def test_nobody_answering_falls_back_to_ask_fallback(published, settings, fallback, allowed):
    settings.OPENCLAW_EXEC_APPROVAL_TIMEOUT_MS = 1000
    set_policy({"version": 1, "defaults": {"askFallback": fallback}})
    decision = gate().decide("call-1", ExecRequest("make deploy"), should_stop=never)
    approval = ExecApproval.objects.get()
    assert (approval.status, approval.terminal_reason) == ("expired", "timeout")
    assert decision.allowed is allowed
    if not allowed:
        assert decision.reason == "exec denied: the approval timed out (askFallback=deny)"


def test_a_turn_stopped_while_waiting_withdraws_its_approval(published):
    stop_at = time.monotonic() + 0.2
    decision = gate().decide("call-1", ExecRequest("make deploy"), should_stop=lambda: time.monotonic() >= stop_at)
    approval = ExecApproval.objects.get()
    assert decision == ExecDecision(
        False, "not run: the turn was stopped while the command waited for approval", True, approval.pk
    )
    assert (approval.status, approval.terminal_reason) == ("cancelled", "run-aborted")
    assert published.names() == ["exec.approval.requested", "exec.approval.resolved"]


def test_a_retried_step_gets_the_decision_it_had_and_close_withdraws_what_is_left(published):
    first = approvals.exec_approval_request(
        command="make deploy",
        argv=None,
        cwd=CWD,
        host="gateway",
        node_id=None,
        agent_id="main",
        session_key="agent:main:main",
        session_id="w1",
        run_id="run-1",
        tool_call_id="call-1",
        timeout_ms=None,
        requested_by=Actor(label="run:run-1", scopes=()),
    )
    approvals.exec_approval_resolve(approval_id=first.pk, decision="allow-once", actor=OPERATOR)
    started = time.monotonic()
    retried = gate()
    assert retried.decide("call-1", ExecRequest("make deploy"), should_stop=never).allowed
    assert time.monotonic() - started < 0.5
    left = approvals.exec_approval_request(
        command="make other",
        argv=None,
        cwd=CWD,
        host="gateway",
        node_id=None,
        agent_id="main",
        session_key="agent:main:main",
        session_id="w1",
        run_id="run-1",
        tool_call_id="call-2",
        timeout_ms=None,
        requested_by=Actor(label="run:run-1", scopes=()),
    )
    retried.close()  # the turn that asked withdraws everything of its run still pending
    left.refresh_from_db()
    assert (left.status, left.terminal_reason) == ("cancelled", "run-aborted")
    # A cancelled approval found again by a retried step is not a permission.
    assert not gate().decide("call-2", ExecRequest("make other"), should_stop=never).allowed


def test_a_turn_that_asked_nothing_reads_nothing_when_it_ends(django_assert_num_queries):
    with django_assert_num_queries(0):
        gate().close()


def test_a_node_command_is_judged_by_both_documents_without_the_gateways_path(published, node):
    set_policy({"version": 1, "defaults": {"security": "full", "ask": "off"}})
    set_policy(
        {
            "version": 1,
            "defaults": exec_policy.MODES["allowlist"],
            "agents": {"main": {"allowlist": [{"pattern": "ls"}, {"pattern": "/usr/bin/*"}]}},
        },
        scope=node_scope(NODE_ID),
    )
    on_node = gate(node_id=NODE_ID)
    assert on_node.decide("call-1", ExecRequest("ls -la"), should_stop=never).allowed
    # The gateway cannot look up the node's PATH: a bare name does not match a path pattern there.
    refused = on_node.decide("call-2", ExecRequest("cat x"), should_stop=never)
    assert refused == ExecDecision(False, "exec denied: not on the allowlist (ask=off)")
    assert on_node.decide("call-3", ExecRequest("/usr/bin/cat x"), should_stop=never).allowed
    # The same command on the gateway: its own document (full) allows it.
    assert gate().decide("call-4", ExecRequest("cat x"), should_stop=never).allowed


def test_a_node_command_waiting_for_approval_names_the_node(published, node):
    operator = answer_when_asked("allow-always")
    assert gate(node_id=NODE_ID).decide("call-1", ExecRequest("make deploy"), should_stop=never).allowed
    operator.join()
    approval = ExecApproval.objects.get()
    assert (approval.host, approval.node_id, approval.request["nodeId"]) == ("node", NODE_ID, NODE_ID)
    assert ExecApprovalPolicy.objects.filter(scope=node_scope(NODE_ID)).exists()
    assert not ExecApprovalPolicy.objects.filter(scope="gateway").exists()


def test_a_command_no_operator_could_be_shown_is_not_run(published):
    decision = gate().decide("call-1", ExecRequest("echo " + "x" * 9000), should_stop=never)
    assert decision == ExecDecision(False, "exec not run: command exceeds exec approval display limit")
    assert not ExecApproval.objects.exists()
