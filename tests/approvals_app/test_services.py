"""Approval and policy services: idempotent requests, first answer wins (threads on the database too),
allow-always writing the execution host's document, expiry, cancellation, compare-and-set of documents,
audit rows and what is published after commit."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import connection, transaction
from django.utils import timezone

from approvals_app import selectors
from approvals_app.events import settled_cache_key
from approvals_app.models import ApprovalStatus, ExecApproval, ExecApprovalPolicy, node_scope
from approvals_app.services import approvals, policies
from gateway.audit import Actor
from gateway.exceptions import Conflict, InvalidRequest, NotFound
from gateway.models import AuditLog
from openclaw_client.agent import exec_policy

from .conftest import CWD, NODE_ID, ask

pytestmark = pytest.mark.django_db


def world() -> dict:
    """Everything an approval or policy service may change."""
    return {
        "approvals": list(ExecApproval.objects.order_by("pk").values()),
        "policies": list(ExecApprovalPolicy.objects.order_by("pk").values()),
        "audit": AuditLog.objects.count(),
    }


def refused(call, error: type[Exception], message: str, details: dict | None = None) -> None:
    before = world()
    with pytest.raises(error) as caught:
        call()
    assert caught.value.message == message
    if details is not None:
        assert caught.value.details == details
    assert world() == before


def request(**overrides) -> ExecApproval:
    return approvals.exec_approval_request(**ask(**overrides))


# --- asking ------------------------------------------------------------------------------------------


def test_a_request_is_stored_and_announced_after_commit(django_capture_on_commit_callbacks, published, settings):
    settings.OPENCLAW_EXEC_APPROVAL_TIMEOUT_MS = 60_000
    with django_capture_on_commit_callbacks(execute=True):
        approval = request(warning_text="careful")

    assert approval.status == ApprovalStatus.PENDING
    assert approval.expires_at - approval.created_at == timedelta(milliseconds=60_000)
    assert approval.request == {
        "command": "git push origin main",
        "commandArgv": None,
        "cwd": CWD,
        "nodeId": None,
        "host": "gateway",
        "security": "allowlist",
        "ask": "on-miss",
        "agentId": "main",
        "sessionKey": "agent:main:main",
        "sessionId": "window-1",
        "runId": "run-1",
        "toolCallId": "call-1",
        "allowedDecisions": ["allow-once", "allow-always", "deny"],
        "warningText": "careful",
    }
    assert published.events() == [
        (
            "exec.approval.requested",
            {
                "approvalKind": "exec",
                "id": approval.id,
                "request": approval.request,
                "createdAtMs": int(approval.created_at.timestamp() * 1000),
                "expiresAtMs": int(approval.expires_at.timestamp() * 1000),
            },
        )
    ]


def test_nothing_is_announced_when_the_callers_transaction_rolls_back(published):
    with pytest.raises(RuntimeError), transaction.atomic():
        request()
        raise RuntimeError("the turn failed after asking")
    assert published == []
    assert not ExecApproval.objects.exists()


def test_a_retried_tool_step_gets_the_approval_it_asked_for_pending_or_decided(operator_actor, published):
    first = request()
    again = request(command="something else entirely")
    assert again.pk == first.pk and ExecApproval.objects.count() == 1

    approvals.exec_approval_resolve(approval_id=first.pk, decision="allow-once", actor=operator_actor)
    decided = request()
    assert (decided.pk, decided.status, decided.decision) == (first.pk, "approved", "allow-once")
    # Another tool call of the run is another approval.
    assert request(tool_call_id="call-2").pk != first.pk


def test_the_display_form_escapes_invisible_characters_and_ask_always_offers_no_allow_always():
    approval = request(command="ls\u202e -la\nrm x", ask="always")
    assert approval.command == "ls\u202e -la\nrm x"  # what runs is kept as asked
    assert approval.request["command"] == "ls\\u{202E} -la\\u{A}rm x"
    assert approval.request["allowedDecisions"] == ["allow-once", "deny"]
    # Nothing the allowlist can keep (substitution), or nowhere to keep it (no directory): no allow-always.
    assert request(tool_call_id="c2", command="ls $(id)").request["allowedDecisions"] == ["allow-once", "deny"]
    assert request(tool_call_id="c3", cwd=None).request["allowedDecisions"] == ["allow-once", "deny"]
    # An argv runs without a shell: displayed joined, kept as given.
    argv = request(tool_call_id="c4", command="", argv=["echo", "a b"])
    assert (argv.command, argv.command_argv, argv.request["command"]) == ("echo 'a b'", ["echo", "a b"], "echo 'a b'")


def test_request_refusals_change_nothing(node):
    refused(lambda: request(command="  "), InvalidRequest, "command is required")
    refused(
        lambda: request(command="x" * 8193),
        InvalidRequest,
        "command exceeds exec approval display limit",
        {"reason": "EXEC_APPROVAL_COMMAND_DISPLAY_LIMIT"},
    )
    # Escaping counts: 2000 control characters show as 10000 characters (five each).
    refused(lambda: request(command="\x01" * 2000), InvalidRequest, "command exceeds exec approval display limit")
    refused(lambda: request(approval_id="plugin:x"), InvalidRequest, "approval ids starting with plugin: are reserved")
    refused(lambda: request(host="node", node_id=None), InvalidRequest, "nodeId is required for host=node")
    refused(lambda: request(host="node", node_id="f" * 64), NotFound, "unknown nodeId")
    refused(lambda: request(host="elsewhere"), InvalidRequest, "host must be gateway or node")
    first = request(approval_id="fixed", run_id=None, tool_call_id=None)
    refused(
        lambda: request(approval_id="fixed", run_id=None, tool_call_id=None),
        InvalidRequest,
        "approval id already pending",
    )
    assert first.pk == "fixed"


def test_a_node_request_names_the_node_and_a_gateway_one_drops_a_stray_node_id(node):
    on_node = request(host="node", node_id=NODE_ID)
    assert (on_node.host, on_node.node_id, on_node.request["nodeId"]) == ("node", NODE_ID, NODE_ID)
    implied = request(host=None, node_id=NODE_ID, tool_call_id="c2")
    assert implied.host == "node"
    local = request(host="gateway", node_id=NODE_ID, tool_call_id="c3")
    assert (local.node_id, local.request["nodeId"]) == ("", None)


# --- deciding ----------------------------------------------------------------------------------------


def test_a_decision_is_recorded_audited_and_published(django_capture_on_commit_callbacks, published, operator_actor):
    approval = request()
    published.clear()
    with django_capture_on_commit_callbacks(execute=True):
        decided = approvals.exec_approval_resolve(approval_id=approval.pk, decision="deny", actor=operator_actor)

    approval.refresh_from_db()
    assert (approval.status, approval.decision, approval.resolved_by, approval.resolved_by_device) == (
        "denied",
        "deny",
        "device:op",
        "op",
    )
    assert decided.resolved_at == approval.resolved_at
    row = AuditLog.objects.get(action="exec.approval.resolve")
    assert (row.actor, row.target_type, row.target_id) == ("device:op", "exec_approval", approval.pk)
    assert row.data["decision"] == "deny" and row.data["command"] == "git push origin main"
    assert row.data["sessionKey"] == "agent:main:main" and row.data["runId"] == "run-1"
    assert (row.data["before"], row.data["after"]) == ("pending", "denied")
    [(event, payload)] = published.events()
    assert event == "exec.approval.resolved"
    assert payload == {
        "id": approval.pk,
        "decision": "deny",
        "resolvedBy": "device:op",
        "ts": int(approval.resolved_at.timestamp() * 1000),
        "request": approval.request,
    }
    assert published.notifications() == [{"type": "approvals.settled", "id": approval.pk, "status": "denied"}]
    assert selectors.approval_decision(approval) == "deny"


def test_first_answer_wins_the_same_answer_again_is_ok_another_is_refused(operator_actor):
    approval = request()
    approvals.exec_approval_resolve(approval_id=approval.pk, decision="allow-once", actor=operator_actor)
    again = approvals.exec_approval_resolve(
        approval_id=approval.pk, decision="allow-once", actor=Actor(label="device:other")
    )
    assert again.resolved_by == "device:op"
    refused(
        lambda: approvals.exec_approval_resolve(approval_id=approval.pk, decision="deny", actor=operator_actor),
        Conflict,
        "approval already resolved",
        {"reason": "APPROVAL_ALREADY_RESOLVED"},
    )
    assert AuditLog.objects.filter(action="exec.approval.resolve").count() == 1


def test_resolve_refusals_change_nothing(operator_actor):
    approval = request(ask="always")
    not_found = {
        "reason": "APPROVAL_NOT_FOUND",
        "remediation": "Re-request the action; pending approvals are cleared after expiry or restart.",
    }
    refused(
        lambda: approvals.exec_approval_resolve(approval_id=approval.pk, decision="yes", actor=operator_actor),
        InvalidRequest,
        "invalid decision",
    )
    refused(
        lambda: approvals.exec_approval_resolve(approval_id="nope", decision="deny", actor=operator_actor),
        NotFound,
        "unknown or expired approval id",
        not_found,
    )
    refused(
        lambda: approvals.exec_approval_resolve(approval_id=approval.pk, decision="allow-always", actor=operator_actor),
        InvalidRequest,
        "allow-always is unavailable for this command",
        {"reason": "APPROVAL_ALLOW_ALWAYS_UNAVAILABLE"},
    )
    # Past its expiry but not swept yet: it cannot be approved any more.
    ExecApproval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    refused(
        lambda: approvals.exec_approval_resolve(approval_id=approval.pk, decision="allow-once", actor=operator_actor),
        NotFound,
        "unknown or expired approval id",
        not_found,
    )


def test_allow_always_adds_the_entry_to_the_gateways_document_in_the_same_transaction(operator_actor):
    approval = request()
    approvals.exec_approval_resolve(approval_id=approval.pk, decision="allow-always", actor=operator_actor)

    row = ExecApprovalPolicy.objects.get(scope="gateway")
    [entry] = row.document["agents"]["main"]["allowlist"]
    assert entry["pattern"] == "git" and entry["source"] == "allow-always"
    assert entry["argPattern"] == exec_policy.cwd_argv_hash(["git", "push", "origin", "main"], CWD)
    assert row.hash == exec_policy.document_hash(row.document)
    assert row.updated_by == "device:op"
    # The next identical command runs without asking; another directory still asks.
    policy = selectors.effective_exec_policy("main")
    assert exec_policy.evaluate(policy, "git push origin main", CWD).decision == "allow"
    assert exec_policy.evaluate(policy, "git push origin main", "/elsewhere").decision == "ask"
    added = AuditLog.objects.get(action="exec.approvals.allow-always")
    assert added.target_id == "gateway" and added.data["approvalId"] == approval.pk
    # Asked again and allowed always again: the entry is not added twice.
    second = request(tool_call_id="call-2")
    approvals.exec_approval_resolve(approval_id=second.pk, decision="allow-always", actor=operator_actor)
    assert len(ExecApprovalPolicy.objects.get(scope="gateway").document["agents"]["main"]["allowlist"]) == 1


def test_allow_always_of_a_node_command_extends_the_nodes_document_not_the_gateways(node, operator_actor):
    approval = request(host="node", node_id=NODE_ID, agent_id="ops")
    approvals.exec_approval_resolve(approval_id=approval.pk, decision="allow-always", actor=operator_actor)
    assert not ExecApprovalPolicy.objects.filter(scope="gateway").exists()
    document = ExecApprovalPolicy.objects.get(scope=node_scope(NODE_ID)).document
    assert [e["pattern"] for e in document["agents"]["ops"]["allowlist"]] == ["git"]


def test_allow_always_on_a_full_allowlist_is_refused_and_the_approval_stays_pending(operator_actor):
    entries = [{"pattern": f"cmd{i}"} for i in range(exec_policy.MAX_ALLOWLIST_ENTRIES)]
    policies.exec_policy_set(
        scope="gateway",
        file={"version": 1, "agents": {"main": {"allowlist": entries}}},
        base_hash=None,
        actor=operator_actor,
    )
    approval = request()
    refused(
        lambda: approvals.exec_approval_resolve(approval_id=approval.pk, decision="allow-always", actor=operator_actor),
        InvalidRequest,
        "the exec allowlist of agent main is full (1000 entries); "
        "remove entries with exec.approvals.set, or allow once",
    )
    assert ExecApproval.objects.get(pk=approval.pk).status == "pending"


# --- expiry and cancellation ---------------------------------------------------------------------------


def test_the_sweep_expires_overdue_approvals_only(django_capture_on_commit_callbacks, published):
    overdue = request()
    fresh = request(tool_call_id="call-2")
    ExecApproval.objects.filter(pk=overdue.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    published.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert approvals.exec_approvals_expire_due() == 1
        assert approvals.exec_approvals_expire_due() == 0

    overdue.refresh_from_db()
    assert (overdue.status, overdue.decision, overdue.terminal_reason) == ("expired", "", "timeout")
    assert ExecApproval.objects.get(pk=fresh.pk).status == "pending"
    row = AuditLog.objects.get(action="exec.approval.expire")
    assert (row.actor, row.target_id, row.data["reason"]) == ("gateway:expiry", overdue.pk, "timeout")
    [(event, payload)] = published.events()
    assert event == "exec.approval.resolved"
    assert (payload["decision"], payload["resolvedBy"], payload["terminalReason"]) == (None, None, "timeout")
    assert selectors.wait_payload(overdue)["decision"] is None
    assert selectors.wait_payload(overdue)["terminalReason"] == "timeout"


def test_an_expired_approval_cannot_be_decided_and_a_decided_one_is_not_expired(operator_actor):
    decided = request()
    approvals.exec_approval_resolve(approval_id=decided.pk, decision="deny", actor=operator_actor)
    ExecApproval.objects.filter(pk=decided.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert approvals.exec_approval_expire(approval_id=decided.pk) is None
    assert ExecApproval.objects.get(pk=decided.pk).status == "denied"


def test_cancel_for_run_withdraws_its_pending_approvals_only(
    django_capture_on_commit_callbacks, published, operator_actor
):
    pending = request()
    decided = request(tool_call_id="call-2")
    approvals.exec_approval_resolve(approval_id=decided.pk, decision="allow-once", actor=operator_actor)
    other_run = request(run_id="run-2")
    published.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert approvals.exec_approvals_cancel_for_run("run-1", "run-aborted") == 1

    pending.refresh_from_db()
    assert (pending.status, pending.terminal_reason) == ("cancelled", "run-aborted")
    assert ExecApproval.objects.get(pk=decided.pk).status == "approved"
    assert ExecApproval.objects.get(pk=other_run.pk).status == "pending"
    row = AuditLog.objects.get(action="exec.approval.cancel")
    assert (row.actor, row.data["reason"], row.data["sessionKey"]) == ("run:run-1", "run-aborted", "agent:main:main")
    [(event, payload)] = published.events()
    assert (event, payload["decision"], payload["terminalReason"]) == ("exec.approval.resolved", None, "run-aborted")
    assert approvals.exec_approvals_cancel_for_run("", "x") == 0
    # A cancelled approval is gone for operators: it cannot be decided.
    refused(
        lambda: approvals.exec_approval_resolve(approval_id=pending.pk, decision="deny", actor=operator_actor),
        NotFound,
        "unknown or expired approval id",
    )


def test_a_settled_approval_sets_the_flag_synchronous_waiters_read(django_capture_on_commit_callbacks, operator_actor):
    approval = request()
    assert cache.get(settled_cache_key(approval.pk)) is None
    with django_capture_on_commit_callbacks(execute=True):
        approvals.exec_approval_resolve(approval_id=approval.pk, decision="deny", actor=operator_actor)
    assert cache.get(settled_cache_key(approval.pk)) == "denied"


# --- policy documents --------------------------------------------------------------------------------


DOCUMENT = {"version": 1, "defaults": {"security": "allowlist", "ask": "off"}, "agents": {"main": {}}}


def test_a_first_document_needs_no_hash_then_every_write_needs_the_current_one(operator_actor):
    first = policies.exec_policy_set(scope="gateway", file=DOCUMENT, base_hash=None, actor=operator_actor)
    snapshot = selectors.exec_policy_snapshot("gateway")
    assert snapshot["exists"] is True and snapshot["hash"] == first.hash
    assert snapshot["resolvedDefaults"] == {
        "security": "allowlist",
        "ask": "off",
        "askFallback": "deny",
        "autoAllowSkills": False,
    }
    changed = {**DOCUMENT, "defaults": {"security": "deny"}}
    second = policies.exec_policy_set(scope="gateway", file=changed, base_hash=first.hash, actor=operator_actor)
    assert second.hash != first.hash
    row = AuditLog.objects.filter(action="exec.approvals.set").order_by("pk").last()
    assert (row.target_id, row.data["beforeHash"], row.data["afterHash"]) == ("gateway", first.hash, second.hash)
    assert row.data["after"]["defaults"] == {"security": "deny"}


def test_policy_set_refusals_change_nothing(operator_actor, node):
    stored = policies.exec_policy_set(scope="gateway", file=DOCUMENT, base_hash=None, actor=operator_actor)
    refused(
        lambda: policies.exec_policy_set(scope="gateway", file=DOCUMENT, base_hash=None, actor=operator_actor),
        InvalidRequest,
        "exec approvals base hash required; re-run exec.approvals.get and retry",
    )
    refused(
        lambda: policies.exec_policy_set(scope="gateway", file=DOCUMENT, base_hash="f" * 64, actor=operator_actor),
        Conflict,
        "exec approvals changed since last load; re-run exec.approvals.get and retry",
    )
    refused(
        lambda: policies.exec_policy_set(
            scope="gateway",
            file={"version": 1, "defaults": {"ask": "never"}},
            base_hash=stored.hash,
            actor=operator_actor,
        ),
        InvalidRequest,
        "invalid exec approvals file: at /defaults/ask: must be one of off, on-miss, always",
    )
    # A scope without a document takes only the "missing" hash exec.approvals.get gave.
    refused(
        lambda: policies.exec_policy_set(
            scope=node_scope(NODE_ID), file=DOCUMENT, base_hash=stored.hash, actor=operator_actor
        ),
        Conflict,
        "exec approvals changed since last load; re-run exec.approvals.get and retry",
    )
    refused(
        lambda: policies.exec_policy_set(
            scope=node_scope("f" * 64), file=DOCUMENT, base_hash=None, actor=operator_actor
        ),
        NotFound,
        "unknown nodeId",
    )
    refused(
        lambda: policies.exec_policy_set(scope="elsewhere", file=DOCUMENT, base_hash=None, actor=operator_actor),
        NotFound,
        "unknown exec policy scope: elsewhere",
    )
    node_doc = policies.exec_policy_set(
        scope=node_scope(NODE_ID), file=DOCUMENT, base_hash=exec_policy.MISSING_DOCUMENT_HASH, actor=operator_actor
    )
    assert node_doc.scope == f"node:{NODE_ID}"


def test_the_effective_policy_of_a_node_command_combines_both_documents(operator_actor, node):
    policies.exec_policy_set(
        scope="gateway",
        file={"version": 1, "defaults": {"security": "full", "ask": "off"}, "agents": {"main": {"ask": "always"}}},
        base_hash=None,
        actor=operator_actor,
    )
    policies.exec_policy_set(
        scope=node_scope(NODE_ID),
        file={
            "version": 1,
            "defaults": {"security": "allowlist"},
            "agents": {"main": {"allowlist": [{"pattern": "ls"}]}},
        },
        base_hash=None,
        actor=operator_actor,
    )
    local = selectors.effective_exec_policy("main")
    remote = selectors.effective_exec_policy("main", NODE_ID)
    assert (local.security, local.ask, local.allowlist) == ("full", "always", ())
    assert (remote.security, remote.ask) == ("allowlist", "always")
    assert [e["pattern"] for e in remote.allowlist] == ["ls"]


# --- concurrency on the database ---------------------------------------------------------------------


def _in_threads(count: int, work) -> list:
    """``work(i)`` in ``count`` threads released together; each result or exception, in order."""
    barrier = threading.Barrier(count)
    results: list = [None] * count

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = work(i)
        except Exception as error:
            results[i] = error
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


@pytest.mark.django_db(transaction=True)
def test_concurrent_decisions_have_one_winner(published):
    approval = request()
    decisions = ["allow-once", "deny", "allow-always", "deny", "allow-once", "allow-always"]

    results = _in_threads(
        len(decisions),
        lambda i: approvals.exec_approval_resolve(
            approval_id=approval.pk, decision=decisions[i], actor=Actor(label=f"device:op{i}")
        ),
    )

    approval.refresh_from_db()
    winners = [i for i, r in enumerate(results) if isinstance(r, ExecApproval) and r.resolved_by == f"device:op{i}"]
    assert len(winners) == 1
    assert approval.decision == decisions[winners[0]] and approval.resolved_by == f"device:op{winners[0]}"
    for i, result in enumerate(results):
        if decisions[i] == approval.decision:
            assert isinstance(result, ExecApproval)  # the same answer again is ok
        else:
            assert isinstance(result, Conflict), result
    assert AuditLog.objects.filter(action="exec.approval.resolve").count() == 1
    assert published.names().count("exec.approval.resolved") == 1
    entries = ExecApprovalPolicy.objects.filter(scope="gateway").values_list("document", flat=True).first()
    assert bool(entries) == (approval.decision == "allow-always")


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_of_one_tool_call_make_one_approval(published):
    results = _in_threads(6, lambda i: request(command=f"variant {i}"))
    assert all(isinstance(r, ExecApproval) for r in results), results
    assert len({r.pk for r in results}) == 1
    assert ExecApproval.objects.count() == 1
    assert published.names() == ["exec.approval.requested"]


@pytest.mark.django_db(transaction=True)
def test_a_decision_racing_the_expiry_sweep_settles_once(published):
    for round_ in range(5):
        approval = request(tool_call_id=f"call-{round_}")
        # Due in a moment: the sweep and the operator meet at its expiry.
        ExecApproval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() + timedelta(milliseconds=30))

        def act(i: int, approval_id: str = approval.pk):
            if i == 0:
                deadline = timezone.now() + timedelta(milliseconds=200)
                while timezone.now() < deadline:
                    if approvals.exec_approval_expire(approval_id=approval_id):
                        return "expired"
                return None
            try:
                approvals.exec_approval_resolve(approval_id=approval_id, decision="deny", actor=Actor(label="op"))
                return "denied"
            except NotFound:
                return None

        results = _in_threads(2, act)
        approval.refresh_from_db()
        assert approval.status in ("expired", "denied")
        assert [r for r in results if r] == [approval.status]
    assert len(published.notifications()) == 5


@pytest.mark.django_db(transaction=True)
def test_concurrent_allow_always_decisions_keep_every_entry(published):
    made = [request(tool_call_id=f"call-{i}", command=f"echo {i}") for i in range(5)]
    results = _in_threads(
        5,
        lambda i: approvals.exec_approval_resolve(
            approval_id=made[i].pk, decision="allow-always", actor=Actor(label=f"device:op{i}")
        ),
    )
    assert all(isinstance(r, ExecApproval) for r in results), results
    document = ExecApprovalPolicy.objects.get(scope="gateway").document
    assert sorted(e["argPattern"] for e in document["agents"]["main"]["allowlist"]) == sorted(
        exec_policy.cwd_argv_hash(["echo", str(i)], CWD) for i in range(5)
    )


@pytest.mark.django_db(transaction=True)
def test_concurrent_document_writes_with_one_base_hash_have_one_winner():
    actor = Actor(label="op")
    base = policies.exec_policy_set(scope="gateway", file=DOCUMENT, base_hash=None, actor=actor)
    results = _in_threads(
        5,
        lambda i: policies.exec_policy_set(
            scope="gateway",
            file={**DOCUMENT, "defaults": {"security": "deny", "ask": "off"} if i else {}},
            base_hash=base.hash,
            actor=actor,
        ),
    )
    assert sum(isinstance(r, ExecApprovalPolicy) for r in results) == 1
    assert all(isinstance(r, ExecApprovalPolicy | Conflict) for r in results), results
    assert AuditLog.objects.filter(action="exec.approvals.set").count() == 2


def test_a_cache_that_fails_does_not_fail_a_committed_decision(
    django_capture_on_commit_callbacks, published, operator_actor, monkeypatch
):
    approval = request()

    def broken(*args, **kwargs):
        raise ConnectionError("redis went away")

    monkeypatch.setattr(cache, "set", broken)
    with django_capture_on_commit_callbacks(execute=True):
        approvals.exec_approval_resolve(approval_id=approval.pk, decision="deny", actor=operator_actor)
    assert ExecApproval.objects.get(pk=approval.pk).status == "denied"
    assert published.names()[-1] == "exec.approval.resolved"
