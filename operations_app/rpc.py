"""Gateway methods of operations_app, one block per part (docs/operations.md)."""

from __future__ import annotations

import asyncio

from gateway import scopes as sc
from gateway.context import RpcContext
from gateway.registry import registry

from . import logs, selectors
from .schemas import DEFAULT_SESSIONS_LIMIT, LogsTailParams, SessionsUsageParams, UsageCostParams, UsageStatusParams
from .usage_window import resolve_window

method = registry.method


# --- logs ---------------------------------------------------------------------------------------------


# operator.read, as OpenClaw's method-scope table has it (reference/openclaw-clients.md, protocol.md §3).
@method("logs.tail", params=LogsTailParams, scope=sc.READ)
async def logs_tail_rpc(ctx: RpcContext, params: LogsTailParams) -> dict:
    # File reading only: a thread of its own, not the database hop's thread that other requests queue for.
    tail = await asyncio.to_thread(
        logs.log_tail,
        logs.log_file(),
        cursor=params.cursor,
        limit=params.limit or logs.DEFAULT_LIMIT,
        max_bytes=params.maxBytes or logs.DEFAULT_MAX_BYTES,
    )
    return tail.as_payload()


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
