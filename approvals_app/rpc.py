"""Methods of exec approvals: the policy documents (``exec.approvals.*``, ``operator.admin``) and the approvals
(``exec.approval.*``, ``approval.history``, ``operator.approvals``)."""

from __future__ import annotations

from channels.db import database_sync_to_async

from gateway import scopes as sc
from gateway.context import RpcContext
from gateway.exceptions import InvalidRequest
from gateway.registry import registry

from . import selectors
from .events import ms
from .models import GATEWAY_SCOPE, ExecApproval
from .schemas import (
    ApprovalHistoryParams,
    ApprovalIdParams,
    ExecApprovalRequestParams,
    ExecApprovalResolveParams,
    ExecPolicyNodeSetParams,
    ExecPolicySetBody,
    NodeIdParams,
)
from .services import approvals, policies
from .waiters import wait_for_settled

method = registry.method

WAIT_NOT_FOUND = "approval expired or not found"


# --- policy documents ----------------------------------------------------------------------------------


@method("exec.approvals.get", scope=sc.ADMIN)
def exec_approvals_get_rpc(ctx: RpcContext, params) -> dict:
    return selectors.exec_policy_snapshot(GATEWAY_SCOPE)


# A whole policy document: its own limits (entries, patterns) allow more than the default frame.
@method("exec.approvals.set", params=ExecPolicySetBody, scope=sc.ADMIN, max_frame_bytes=None)
def exec_approvals_set_rpc(ctx: RpcContext, params: ExecPolicySetBody) -> dict:
    row = policies.exec_policy_set(scope=GATEWAY_SCOPE, file=params.file, base_hash=params.baseHash, actor=ctx.actor())
    return selectors.exec_policy_payload(GATEWAY_SCOPE, row)


@method("exec.approvals.node.get", params=NodeIdParams, scope=sc.ADMIN)
def exec_approvals_node_get_rpc(ctx: RpcContext, params: NodeIdParams) -> dict:
    return selectors.exec_policy_snapshot(selectors.node_policy_scope(params.nodeId))


@method("exec.approvals.node.set", params=ExecPolicyNodeSetParams, scope=sc.ADMIN, max_frame_bytes=None)
def exec_approvals_node_set_rpc(ctx: RpcContext, params: ExecPolicyNodeSetParams) -> dict:
    scope = selectors.node_policy_scope(params.nodeId)
    row = policies.exec_policy_set(scope=scope, file=params.file, base_hash=params.baseHash, actor=ctx.actor())
    return selectors.exec_policy_payload(scope, row)


# --- approvals -----------------------------------------------------------------------------------------


def _request(ctx: RpcContext, params: ExecApprovalRequestParams) -> tuple[ExecApproval, str | None]:
    approval = approvals.exec_approval_request(
        command=params.command or "",
        argv=params.commandArgv,
        cwd=params.cwd,
        host=params.host,
        node_id=params.nodeId,
        agent_id=params.agentId,
        session_key=params.sessionKey,
        session_id=params.sessionId,
        run_id=params.runId,
        tool_call_id=params.toolCallId,
        timeout_ms=params.timeoutMs,
        requested_by=ctx.actor(),
        approval_id=params.id,
        security=params.security,
        ask=params.ask,
        warning_text=params.warningText,
    )
    route = selectors.delivery_route(exclude_conn_id=ctx.conn_id) if params.twoPhase else None
    return approval, route


@method("exec.approval.request", params=ExecApprovalRequestParams, scope=sc.APPROVALS)
async def exec_approval_request_rpc(ctx: RpcContext, params: ExecApprovalRequestParams) -> dict:
    """Ask, then answer once decided (or expired: ``decision: null``); with ``twoPhase`` answer at once and
    let ``exec.approval.waitDecision`` wait."""
    approval, route = await database_sync_to_async(_request)(ctx, params)
    if params.twoPhase:
        return {
            "status": "accepted",
            "id": approval.id,
            "deliveryRoute": route,
            "createdAtMs": ms(approval.created_at),
            "expiresAtMs": ms(approval.expires_at),
        }
    settled = await wait_for_settled(approval.id)
    return selectors.request_decided_payload(settled or approval)


@method("exec.approval.waitDecision", params=ApprovalIdParams, scope=sc.APPROVALS)
async def exec_approval_wait_decision_rpc(ctx: RpcContext, params: ApprovalIdParams) -> dict:
    settled = await wait_for_settled(params.id)
    if settled is None:
        raise InvalidRequest(WAIT_NOT_FOUND)
    return selectors.wait_payload(settled)


@method("exec.approval.get", params=ApprovalIdParams, scope=sc.APPROVALS)
def exec_approval_get_rpc(ctx: RpcContext, params: ApprovalIdParams) -> dict:
    return selectors.approval_get_payload(selectors.pending_approval_require(params.id))


@method("exec.approval.list", scope=sc.APPROVALS)
def exec_approval_list_rpc(ctx: RpcContext, params) -> list[dict]:
    return selectors.approval_list()


@method("exec.approval.resolve", params=ExecApprovalResolveParams, scope=sc.APPROVALS)
def exec_approval_resolve_rpc(ctx: RpcContext, params: ExecApprovalResolveParams) -> dict:
    approvals.exec_approval_resolve(approval_id=params.id, decision=params.decision, actor=ctx.actor())
    return {"ok": True}


@method("approval.history", params=ApprovalHistoryParams, scope=sc.APPROVALS)
def approval_history_rpc(ctx: RpcContext, params: ApprovalHistoryParams) -> dict:
    return selectors.approval_history(limit=params.limit, cursor=params.cursor, kind=params.kind)
