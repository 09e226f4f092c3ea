"""Gateway methods of operations."""

from __future__ import annotations

from gateway import scopes as sc
from gateway.context import RpcContext
from gateway.registry import registry

from . import selectors
from .schemas import DEFAULT_SESSIONS_LIMIT, SessionsUsageParams, UsageCostParams, UsageStatusParams
from .usage_window import resolve_window

method = registry.method


# --- usage (OpenClaw's usage.status, usage.cost, sessions.usage; docs/operations.md "Usage") ---------------


@method("usage.status", params=UsageStatusParams, scope=sc.READ)
def usage_status_rpc(ctx: RpcContext, params: UsageStatusParams) -> dict:
    return selectors.usage_status_payload()


@method("usage.cost", params=UsageCostParams, scope=sc.READ)
def usage_cost_rpc(ctx: RpcContext, params: UsageCostParams) -> dict:
    window = resolve_window(params, days=params.days)
    scope = selectors.usage_scope(agent_id=params.agentId, agent_scope=params.agentScope)
    return selectors.usage_cost_payload(selectors.usage_report(window, scope))


# Not in OpenClaw's hello-ok either (its Control UI calls it without looking it up).
@method("sessions.usage", params=SessionsUsageParams, scope=sc.READ, advertise=False)
def sessions_usage_rpc(ctx: RpcContext, params: SessionsUsageParams) -> dict:
    window = resolve_window(params)
    scope = selectors.usage_scope(
        agent_id=params.agentId, agent_scope=params.agentScope, key=params.key, accepts_key=True
    )
    report = selectors.usage_report(window, scope, session_limit=params.limit or DEFAULT_SESSIONS_LIMIT, by_agent=True)
    return selectors.sessions_usage_payload(report, include_context_weight=bool(params.includeContextWeight))
