"""The sessions' part of ``status`` (stored sessions, default model, agents' heartbeats) and ``diagnostics.lanes``.

Both are OpenClaw's shapes filled from this gateway's tables. As OpenClaw's ``status``, the default model and
the recent sessions are shown to ``operator.admin`` callers only; everyone with ``operator.read`` sees the counts.
"""

from __future__ import annotations

from django.db.models import Count, F, Window
from django.db.models.functions import RowNumber

from gateway.selectors import now_ms

from . import agents
from .model_providers import default_model
from .models import Run, RunStatus, Session

# Recent sessions per agent (and overall) that ``status`` shows, as OpenClaw's.
STATUS_RECENT_SESSIONS = 10


def _recent_row(session: Session, now: int) -> dict:
    updated_at = int(session.updated_at.timestamp() * 1000)
    return {
        "agentId": session.agent_id,
        "key": session.key,
        "kind": "direct",
        "sessionId": session.session_id,
        "updatedAt": updated_at,
        "age": max(0, now - updated_at),
        "inputTokens": session.input_tokens,
        "outputTokens": session.output_tokens,
        # The gateway knows no model's context window, so nothing can be said of the context used.
        "totalTokens": None,
        "remainingTokens": None,
        "percentUsed": None,
        "contextTokens": None,
        "model": session.model or default_model(),
        "flags": [f"id:{session.session_id}"],
    }


def _recent_by_agent() -> dict[str, list[Session]]:
    """Each agent's newest sessions, newest first, in one query (a row number per agent)."""
    ranked = (
        Session.objects.annotate(
            rank=Window(RowNumber(), partition_by=[F("agent_id")], order_by=[F("updated_at").desc(), F("id").desc()])
        )
        .filter(rank__lte=STATUS_RECENT_SESSIONS)
        .only("key", "agent_id", "session_id", "updated_at", "input_tokens", "output_tokens", "model")
        .order_by("-updated_at", "-id")
    )
    by_agent: dict[str, list[Session]] = {}
    for session in ranked:
        by_agent.setdefault(session.agent_id, []).append(session)
    return by_agent


def status_sessions(ctx) -> dict:
    """``status``'s ``heartbeat`` and ``sessions``: one count query, and for an admin one more for the rows."""
    sensitive = ctx is not None and ctx.is_admin
    counts = dict(Session.objects.order_by().values_list("agent_id").annotate(count=Count("id")))
    agent_ids = agents.ordered_agent_ids(counts)
    now = now_ms()
    recent_by_agent = _recent_by_agent() if sensitive else {}
    newest = sorted(
        (session for sessions in recent_by_agent.values() for session in sessions),
        key=lambda session: (session.updated_at, session.pk),
        reverse=True,
    )[:STATUS_RECENT_SESSIONS]
    return {
        "heartbeat": agents.heartbeat_summary(agent_ids),
        "sessions": {
            # OpenClaw's session store files: the sessions live in the database here.
            "paths": [],
            "count": sum(counts.values()),
            "defaults": {"model": default_model() if sensitive else None, "contextTokens": None},
            "recent": [_recent_row(session, now) for session in newest],
            "byAgent": [
                {
                    "agentId": agent_id,
                    "count": counts.get(agent_id, 0),
                    "recent": [_recent_row(session, now) for session in recent_by_agent.get(agent_id, [])],
                }
                for agent_id in agent_ids
            ],
        },
    }


def session_lanes() -> dict:
    """``diagnostics.lanes``: each session is a lane (its turns run one at a time, the others wait queued), as
    OpenClaw's dynamic session lanes. The gateway has no fixed-size lanes of its own (turns run on Celery workers
    or in the gateway's task threads), so ``lanes`` is empty. Gateway-wide: every process's turns are counted."""
    per_session = (
        Run.objects.filter(status__in=[RunStatus.QUEUED, RunStatus.RUNNING])
        .order_by()
        .values_list("session_id", "status")
        .annotate(count=Count("run_id"))
    )
    sessions: set[int] = set()
    queued_sessions: set[int] = set()
    active = queued = 0
    for session_id, status, count in per_session:
        sessions.add(session_id)
        if status == RunStatus.RUNNING:
            active += count
        else:
            queued += count
            queued_sessions.add(session_id)
    dynamic = None
    if sessions:
        dynamic = {
            "laneCount": len(sessions),
            "activeCount": active,
            "queuedCount": queued,
            "queuedLaneCount": len(queued_sessions),
        }
    return {"ts": now_ms(), "lanes": [], "dynamic": dynamic}
