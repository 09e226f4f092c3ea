"""JSON API of exec approvals (``/api/approvals/``): pending approvals and their decisions, the history, and
the exec policy documents of the gateway and of each node.

Each route calls the service or selector of its gateway method (named in its description) with that
method's schema; ids the RPC takes in ``params`` are in the path. The gateway token is a full operator.
"""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Path, Query, Router

from gateway.http_auth import request_actor
from gateway.schemas import error_responses

from . import selectors
from .models import GATEWAY_SCOPE
from .schemas import (
    ApprovalGetOut,
    ApprovalHistoryOut,
    ApprovalHistoryParams,
    ApprovalIdParams,
    ExecPolicyOut,
    ExecPolicySetBody,
    NodeIdParams,
    PendingApprovalOut,
    ResolveBody,
    ResolveOut,
)
from .services import approvals, policies

router = Router(tags=["approvals"])


@router.get("/", response={200: list[PendingApprovalOut], **error_responses()}, summary="List pending approvals")
def approval_list(request: HttpRequest):
    """``exec.approval.list``: the exec approvals waiting for a decision, oldest first."""
    return selectors.approval_list()


@router.get(
    "/history", response={200: ApprovalHistoryOut, **error_responses()}, summary="Settled approvals", exclude_unset=True
)
def approval_history(request: HttpRequest, query: Query[ApprovalHistoryParams]):
    """``approval.history``: approvals that left pending (allowed, denied, expired, cancelled), newest first, as
    OpenClaw's terminal approval snapshots; pass ``nextCursor`` back as ``cursor`` for the next page."""
    return selectors.approval_history(limit=query.limit, cursor=query.cursor, kind=query.kind)


# --- policy documents (before /{id}: "policy" is not an approval id here) ---------------------------------


@router.get("/policy", response={200: ExecPolicyOut, **error_responses()}, summary="Get the gateway's exec policy")
def exec_policy_get(request: HttpRequest):
    """``exec.approvals.get``: the gateway's document, its hash (send it back as ``baseHash``), and the
    defaults it resolves to."""
    return selectors.exec_policy_snapshot(GATEWAY_SCOPE)


@router.put(
    "/policy", response={200: ExecPolicyOut, **error_responses(409)}, summary="Replace the gateway's exec policy"
)
def exec_policy_set(request: HttpRequest, payload: ExecPolicySetBody):
    """``exec.approvals.set``: the whole document; ``baseHash`` is required once a document exists, and a
    stale one is a 409 (re-read and retry)."""
    row = policies.exec_policy_set(
        scope=GATEWAY_SCOPE, file=payload.file, base_hash=payload.baseHash, actor=request_actor(request)
    )
    return selectors.exec_policy_payload(GATEWAY_SCOPE, row)


@router.get(
    "/nodes/{nodeId}/policy",
    response={200: ExecPolicyOut, **error_responses(404)},
    summary="Get a node's exec policy",
)
def exec_policy_node_get(request: HttpRequest, params: Path[NodeIdParams]):
    """``exec.approvals.node.get``: the document the gateway keeps for a paired node."""
    return selectors.exec_policy_snapshot(selectors.node_policy_scope(params.nodeId))


@router.put(
    "/nodes/{nodeId}/policy",
    response={200: ExecPolicyOut, **error_responses(404, 409)},
    summary="Replace a node's exec policy",
)
def exec_policy_node_set(request: HttpRequest, params: Path[NodeIdParams], payload: ExecPolicySetBody):
    """``exec.approvals.node.set``: as for the gateway's document, for a paired node's."""
    scope = selectors.node_policy_scope(params.nodeId)
    row = policies.exec_policy_set(
        scope=scope, file=payload.file, base_hash=payload.baseHash, actor=request_actor(request)
    )
    return selectors.exec_policy_payload(scope, row)


# --- one approval ------------------------------------------------------------------------------------------


@router.get("/{id}", response={200: ApprovalGetOut, **error_responses(404)}, summary="Get a pending approval")
def approval_get(request: HttpRequest, params: Path[ApprovalIdParams]):
    """``exec.approval.get``: the command as shown to operators and the decisions it allows."""
    return selectors.approval_get_payload(selectors.pending_approval_require(params.id))


@router.post(
    "/{id}/resolve", response={200: ResolveOut, **error_responses(404, 409)}, summary="Decide a pending approval"
)
def approval_resolve(request: HttpRequest, params: Path[ApprovalIdParams], payload: ResolveBody):
    """``exec.approval.resolve``: ``allow-once``, ``allow-always`` (adds the command to the execution host's
    allowlist, bound to its arguments and directory) or ``deny``. The first answer wins: the same decision
    again is answered ``ok``, another one is a 409; an unknown or expired approval is a 404."""
    approvals.exec_approval_resolve(approval_id=params.id, decision=payload.decision, actor=request_actor(request))
    return {"ok": True}
