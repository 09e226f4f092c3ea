"""Reads and wire projections of sessions, transcripts and runs."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from .models import Run, Session, SessionWindow, TranscriptEvent


def _ms(value) -> int | None:
    return int(value.timestamp() * 1000) if value else None


def session_row(session: Session) -> dict:
    """The GatewaySessionRow projection used by sessions.list / sessions.describe."""
    row = {
        "key": session.key,
        "kind": "direct",
        "agentId": session.agent_id,
        "sessionId": session.session_id,
        "lifecycleRevision": session.lifecycle_revision,
        "updatedAt": _ms(session.updated_at),
        "createdAt": _ms(session.created_at),
        "lastInteractionAt": _ms(session.last_interaction_at),
        "label": session.label or None,
        "displayName": session.display_name or None,
        "category": session.category or None,
        "archived": session.archived_at is not None,
        "pinned": session.pinned_at is not None,
        "initializationPending": session.initialization_pending,
        "createdVia": session.created_via,
        "parentSessionKey": session.parent_session_key or None,
        "status": session.status or None,
        "model": session.model or None,
        "modelProvider": session.model_provider or None,
        "inputTokens": session.input_tokens,
        "outputTokens": session.output_tokens,
        "lastRunId": session.last_run_id or None,
    }
    if session.fork_source_session_key:
        row["forkSource"] = {
            "sessionKey": session.fork_source_session_key,
            "sessionId": session.fork_source_session_id,
            "entryId": session.fork_source_entry_id or None,
        }
    if session.cwd:
        row["spawnedCwd"] = session.cwd
    if session.worktree:
        row["worktree"] = session.worktree
    return {k: v for k, v in row.items() if v is not None}


def session_get(key: str) -> Session | None:
    return Session.objects.filter(key=key).first()


def sessions_page(
    *,
    limit: int,
    offset: int,
    agent_id: str | None = None,
    label: str | None = None,
    search: str | None = None,
    archived: bool | str = False,
) -> tuple[list[Session], bool]:
    """One page, newest first, plus whether more follow. Costs one query whatever the table size."""
    qs: QuerySet[Session] = Session.objects.all()
    if agent_id is not None:
        qs = qs.filter(agent_id=agent_id)
    if label is not None:
        qs = qs.filter(label=label)
    if search:
        qs = qs.filter(Q(key__icontains=search) | Q(label__icontains=search) | Q(display_name__icontains=search))
    if archived is True:
        qs = qs.filter(archived_at__isnull=False)
    elif archived is False:
        qs = qs.filter(archived_at__isnull=True)
    rows = list(qs.order_by("-updated_at", "-id")[offset : offset + limit + 1])
    return rows[:limit], len(rows) > limit


def active_path(window: SessionWindow) -> list[TranscriptEvent]:
    """Message events on the path from the newest entry back to the root (``parentId`` links)."""
    events = list(TranscriptEvent.objects.filter(window=window).order_by("seq"))
    if not events:
        return []
    by_id = {event.event_id: event for event in events}
    path = []
    current: TranscriptEvent | None = events[-1]
    seen = set()
    while current is not None and current.event_id not in seen:
        seen.add(current.event_id)
        if current.type == "message":
            path.append(current)
        current = by_id.get(current.parent_id) if current.parent_id else None
    path.reverse()
    return path


HISTORY_TEXT_LIMIT = 12_000


def history_message(event: TranscriptEvent) -> dict:
    body = dict(event.body)
    content = []
    for part in body.get("content", []):
        if part.get("type") == "text" and len(part.get("text", "")) > HISTORY_TEXT_LIMIT:
            part = {**part, "text": part["text"][:HISTORY_TEXT_LIMIT] + "\n...(truncated)..."}
        content.append(part)
    body["content"] = content
    body["__openclaw"] = {"id": event.event_id, "seq": event.seq}
    return body


def chat_history(session: Session, *, limit: int = 200) -> dict:
    window = SessionWindow.objects.get(pk=session.session_id)
    path = active_path(window)
    messages = [history_message(event) for event in path[-limit:]]
    return {
        "sessionKey": session.key,
        "sessionId": session.session_id,
        "messages": messages,
        "totalMessages": len(path),
        "hasMore": len(path) > limit,
    }


def run_get(run_id: str) -> Run | None:
    return Run.objects.filter(run_id=run_id).first()


def run_wait_payload(run: Run) -> dict:
    status = {"ok": "ok", "error": "error", "aborted": "error"}.get(run.status)
    payload: dict = {"runId": run.run_id, "status": status}
    if run.started_at:
        payload["startedAt"] = _ms(run.started_at)
    if run.ended_at:
        payload["endedAt"] = _ms(run.ended_at)
    if run.status == "ok":
        payload["outputText"] = run.output_text
        payload["terminalReply"] = {"disposition": "visible", "text": run.output_text}
    elif run.status == "aborted":
        payload["error"] = "aborted"
        payload["aborted"] = True
        payload["outputText"] = run.output_text
    else:
        payload["error"] = run.error
    return payload
