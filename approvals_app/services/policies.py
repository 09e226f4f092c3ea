"""Exec policy documents: an operator's replacement (compare-and-set on the hash), and the entries an
allow-always decision adds."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from gateway.audit import Actor, audit
from gateway.exceptions import Conflict, InvalidRequest, NotFound
from openclaw_client.agent import exec_policy
from openclaw_client.agent.exec_policy import PolicyDocumentError

from ..models import GATEWAY_SCOPE, NODE_SCOPE_PREFIX, ExecApprovalPolicy
from ..selectors import node_policy_scope

BASE_HASH_REQUIRED = "exec approvals base hash required; re-run exec.approvals.get and retry"
CHANGED_SINCE_LOAD = "exec approvals changed since last load; re-run exec.approvals.get and retry"


def policy_scope_check(scope: str) -> str:
    """``gateway``, or ``node:<id>`` of a paired node; anything else is refused."""
    if scope == GATEWAY_SCOPE:
        return scope
    if scope.startswith(NODE_SCOPE_PREFIX):
        return node_policy_scope(scope.removeprefix(NODE_SCOPE_PREFIX))
    raise NotFound(f"unknown exec policy scope: {scope}")


def document_from_file(file: Any) -> dict[str, Any]:
    """The stored form of a document a caller sent; InvalidRequest naming the field when it is not one."""
    try:
        return exec_policy.normalize_document(file)
    except PolicyDocumentError as error:
        raise InvalidRequest(f"invalid exec approvals file: {error}", details={"path": error.path}) from None


def document_summary(document: dict[str, Any]) -> dict[str, Any]:
    """What an audit row keeps of a document (not the document: up to 200 agents of 1000 entries)."""
    agents = document.get("agents", {})
    return {
        "defaults": document.get("defaults", {}),
        "agents": {
            agent_id: {k: v for k, v in agent.items() if k != "allowlist"} for agent_id, agent in agents.items()
        },
        "allowlistEntries": {agent_id: len(agent.get("allowlist", [])) for agent_id, agent in agents.items()},
    }


def exec_policy_set(*, scope: str, file: Any, base_hash: str | None, actor: Actor) -> ExecApprovalPolicy:
    """Replace a scope's document (``exec.approvals.set`` / ``exec.approvals.node.set``).

    A scope that has a document needs the hash it was read with (``baseHash``); one that has none takes
    no hash, or the "missing" hash ``exec.approvals.get`` gave. A hash that is not the current one changes
    nothing (someone else wrote since the caller read).
    """
    scope = policy_scope_check(scope)
    document = document_from_file(file)
    new_hash = exec_policy.document_hash(document)
    now = timezone.now()
    with transaction.atomic():
        current = ExecApprovalPolicy.objects.filter(scope=scope).first()
        if current is None:
            if base_hash and base_hash != exec_policy.MISSING_DOCUMENT_HASH:
                raise Conflict(CHANGED_SINCE_LOAD)
            try:
                # A savepoint: a concurrent first write of the scope must fail this one cleanly.
                with transaction.atomic():
                    row = ExecApprovalPolicy.objects.create(
                        scope=scope, document=document, hash=new_hash, updated_at=now, updated_by=actor.label
                    )
            except IntegrityError:
                raise Conflict(CHANGED_SINCE_LOAD) from None
            before_hash = exec_policy.MISSING_DOCUMENT_HASH
        else:
            if not base_hash:
                raise InvalidRequest(BASE_HASH_REQUIRED)
            updated = ExecApprovalPolicy.objects.filter(scope=scope, hash=base_hash).update(
                document=document, hash=new_hash, updated_at=now, updated_by=actor.label
            )
            if updated != 1:
                raise Conflict(CHANGED_SINCE_LOAD)
            before_hash = current.hash
            row = ExecApprovalPolicy(
                scope=scope, document=document, hash=new_hash, updated_at=now, updated_by=actor.label
            )
        audit(
            actor,
            "exec.approvals.set",
            "exec_approval_policy",
            scope,
            {"beforeHash": before_hash, "afterHash": new_hash, "after": document_summary(document)},
        )
    return row


def policy_entries_append(
    *, scope: str, agent_id: str, entries: list[dict[str, Any]], actor: Actor, approval_id: str
) -> ExecApprovalPolicy:
    """Add allow-always entries to ``agent_id``'s allowlist in ``scope``'s document (created if missing).

    Called inside the decision's transaction (``exec_approval_resolve``): the entries exist exactly when the
    decision does. Entries already there (same pattern and argPattern) are not added twice; an allowlist at
    its limit refuses the decision rather than dropping an entry an operator made.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("policy_entries_append runs inside the decision's transaction")
    now = timezone.now()
    for _attempt in range(2):
        # Locked: a concurrent allow-always or exec.approvals.set must not lose this change or ours.
        row = ExecApprovalPolicy.objects.select_for_update(no_key=True).filter(scope=scope).first()
        document = row.document if row is not None else exec_policy.empty_document()
        agents = document.setdefault("agents", {})
        agent = agents.setdefault(agent_id, {})
        allowlist = agent.setdefault("allowlist", [])
        present = {(entry.get("pattern"), entry.get("argPattern")) for entry in allowlist}
        added = [entry for entry in entries if (entry["pattern"], entry["argPattern"]) not in present]
        if not added:
            return row if row is not None else _unsaved(scope, document, now, actor)
        if len(allowlist) + len(added) > exec_policy.MAX_ALLOWLIST_ENTRIES:
            raise InvalidRequest(
                f"the exec allowlist of agent {agent_id} is full ({exec_policy.MAX_ALLOWLIST_ENTRIES} entries); "
                "remove entries with exec.approvals.set, or allow once",
                details={"reason": "EXEC_ALLOWLIST_FULL"},
            )
        if len(agents) > exec_policy.MAX_AGENTS:
            raise InvalidRequest(
                f"the exec approvals file has {exec_policy.MAX_AGENTS} agents already; allow once instead",
                details={"reason": "EXEC_ALLOWLIST_FULL"},
            )
        allowlist.extend(added)
        document = document_from_file(document)
        new_hash = exec_policy.document_hash(document)
        if row is not None:
            ExecApprovalPolicy.objects.filter(scope=scope).update(
                document=document, hash=new_hash, updated_at=now, updated_by=actor.label
            )
            before_hash = row.hash
        else:
            try:
                with transaction.atomic():
                    ExecApprovalPolicy.objects.create(
                        scope=scope, document=document, hash=new_hash, updated_at=now, updated_by=actor.label
                    )
            except IntegrityError:
                continue  # created meanwhile: lock it and add to it
            before_hash = exec_policy.MISSING_DOCUMENT_HASH
        audit(
            actor,
            "exec.approvals.allow-always",
            "exec_approval_policy",
            scope,
            {
                "approvalId": approval_id,
                "agentId": agent_id,
                "entries": [{k: e[k] for k in ("id", "pattern", "argPattern")} for e in added],
                "beforeHash": before_hash,
                "afterHash": new_hash,
            },
        )
        return ExecApprovalPolicy(scope=scope, document=document, hash=new_hash, updated_at=now, updated_by=actor.label)
    raise Conflict(CHANGED_SINCE_LOAD)


def _unsaved(scope: str, document: dict[str, Any], now, actor: Actor) -> ExecApprovalPolicy:
    return ExecApprovalPolicy(
        scope=scope, document=document, hash=exec_policy.document_hash(document), updated_at=now, updated_by=actor.label
    )
