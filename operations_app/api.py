"""JSON API of the usage reports (``/api/usage/``): the same params, selectors and payloads as ``usage.status``,
``usage.cost`` and ``sessions.usage``, the params in the query string. The gateway token is a full operator."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router

from gateway.schemas import error_responses

from . import selectors
from .schemas import DEFAULT_SESSIONS_LIMIT, SessionsUsageParams, UsageCostParams, UsageStatusParams
from .usage_window import resolve_window

router = Router(tags=["usage"])


@router.get("/status", response={200: dict[str, Any], **error_responses()}, summary="Provider quota")
def usage_status(request: HttpRequest, query: Query[UsageStatusParams]):
    """``usage.status``: ``{updatedAt, providers}``; this gateway's model providers report no quota windows, so
    ``providers`` is empty (docs/operations.md)."""
    return selectors.usage_status_payload()


@router.get("/cost", response={200: dict[str, Any], **error_responses()}, summary="Tokens and cost per day")
def usage_cost(request: HttpRequest, query: Query[UsageCostParams]):
    """``usage.cost``: tokens and cost per day and in total over ``startDate``..``endDate`` (or ``range``, or
    ``days`` ending today; 30 days by default, at most 366), priced with ``OPENCLAW_MODEL_PRICES``;
    ``missingPricing`` lists the models counted at 0 for want of a price."""
    window = resolve_window(query, days=query.days)
    scope = selectors.usage_scope(agent_id=query.agentId, agent_scope=query.agentScope)
    return selectors.usage_cost_payload(selectors.usage_report(window, scope))


@router.get("/sessions", response={200: dict[str, Any], **error_responses()}, summary="Usage per session")
def usage_sessions(request: HttpRequest, query: Query[SessionsUsageParams]):
    """``sessions.usage``: the sessions with turns in the window (latest activity first, ``limit`` of them), each
    with its tokens and cost per day and model, and the window's totals per model, provider, agent and day."""
    window = resolve_window(query)
    scope = selectors.usage_scope(agent_id=query.agentId, agent_scope=query.agentScope, key=query.key, accepts_key=True)
    report = selectors.usage_report(window, scope, session_limit=query.limit or DEFAULT_SESSIONS_LIMIT, by_agent=True)
    return selectors.sessions_usage_payload(report, include_context_weight=bool(query.includeContextWeight))
