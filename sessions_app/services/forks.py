"""sessions.fork: a new session from a source's history before one of its user messages (§2.4).

Order of checks: source exists; not initializing; upstream-linked sources go to the harness that
declares the link's kind; then, under the source's lock, the generation the caller saw must still
be current and no turn may be running; then the entry must be a user message on the active path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from gateway.audit import Actor, audit
from gateway.exceptions import (
    Busy,
    Conflict,
    GatewayError,
    InvalidRequest,
    NotFound,
    Unavailable,
    internal_error,
)

from .. import events, keys
from ..harnesses import ForkRequest, registry
from ..models import Run, RunStatus, Session, SessionWindow, TranscriptEvent, WindowReason
from ..ports import SessionAction, placements
from ..schemas import SessionsAdoptParams
from . import links
from .initialization import InitializationError, initialization_source
from .transcripts import append_many

logger = logging.getLogger(__name__)

EXTERNAL_HARNESS_MESSAGE = (
    "Session history changes are unavailable because this session is owned by an external agent harness."
)


@dataclass(frozen=True)
class ForkPoint:
    entry: TranscriptEvent
    before: list[TranscriptEvent]  # the active path before the entry


def _text(event: TranscriptEvent) -> str:
    content = event.body.get("content")
    if isinstance(content, str):  # an older shape, or a node's: the text itself
        return content
    parts = content if isinstance(content, list) else []
    return "".join(
        p["text"] for p in parts if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
    )


def _fork_point(source: Session, entry_id: str) -> ForkPoint:
    window = SessionWindow.objects.get(pk=source.session_id)
    entry = TranscriptEvent.objects.filter(window=window, event_id=entry_id).first()
    if entry is None:
        # An entry of an earlier generation (before a reset) exists but is off the active path.
        if TranscriptEvent.objects.filter(window__session=source, event_id=entry_id).exists():
            raise InvalidRequest(f"message entry is not on the active path: {entry_id}")
        raise InvalidRequest(f"message entry not found: {entry_id}")
    if entry.type != "message" or entry.body.get("role") != "user":
        raise InvalidRequest(f"entry is not a user message: {entry_id}")
    path = list(TranscriptEvent.objects.filter(window=window, type="message").order_by("seq"))
    ids = [event.event_id for event in path]
    if entry.event_id not in ids:
        raise InvalidRequest(f"message entry is not on the active path: {entry_id}")
    return ForkPoint(entry=entry, before=path[: ids.index(entry.event_id)])


def _lock_unchanged(key: str, seen: Session) -> Session:
    source = Session.objects.select_for_update(no_key=True).filter(key=key).first()
    # Locked: the generation check and the fork must see the same source.
    if source is None or (source.session_id, source.lifecycle_revision) != (seen.session_id, seen.lifecycle_revision):
        raise Conflict(f"Session {key} changed; retry fork.", details={"code": "SESSION_CHANGED"})
    if Run.objects.filter(session=source, status=RunStatus.RUNNING).exists():
        raise Busy("Fork is unavailable while the agent is working.", retryable=True)
    placements().check_action(source, SessionAction.FORK)
    return source


def session_fork(*, session_key: str, entry_id: str, actor: Actor | None = None) -> dict[str, Any]:
    """With ``actor`` (operator UI) the fork is also written to the audit log."""
    seen = Session.objects.filter(key=session_key).first()
    if seen is None:
        raise NotFound(f"session not found: {session_key}")
    if seen.initialization_pending:
        raise Busy(f"Session {session_key} is initializing; retry fork later.", retryable=True)
    link = links.link_read(seen.key, seen.agent_id)
    if link is not None:
        return _upstream_fork(seen, link, entry_id, actor)
    return _local_fork(seen, entry_id, actor)


def _audit_fork(actor: Actor | None, source: Session, entry_id: str, child_key: str) -> None:
    if actor is not None:
        data = {"entryId": entry_id, "sourceSessionId": source.session_id, "sessionKey": child_key}
        audit(actor, "session.fork", "session", source.key, data)


def _local_fork(seen: Session, entry_id: str, actor: Actor | None) -> dict[str, Any]:
    """Copy the active path before the entry into a new session, in one transaction."""
    with transaction.atomic():
        source = _lock_unchanged(seen.key, seen)
        point = _fork_point(source, entry_id)
        child = Session.objects.create(
            key=keys.dashboard_key(source.agent_id),
            agent_id=source.agent_id,
            label=source.label,
            model=source.model,
            model_provider=source.model_provider,
            cwd=source.cwd,
            created_via="operator",
            parent_session_key=source.key,
            fork_source_session_key=source.key,
            fork_source_session_id=source.session_id,
            fork_source_entry_id=entry_id,
        )
        SessionWindow.objects.create(id=child.session_id, session=child, reason=WindowReason.FORK)
        append_many(
            window_id=child.session_id,
            session_key=child.key,
            bodies=[event.body for event in point.before],
            event_ids=[event.event_id for event in point.before],
        )
        _audit_fork(actor, source, entry_id, child.key)
        events.publish_session_changed_on_commit(child, reason="fork")
    return {"sessionKey": child.key, "editorText": _text(point.entry)}


def _upstream_fork(seen: Session, link: dict[str, Any], entry_id: str, actor: Actor | None) -> dict[str, Any]:
    candidates = registry.for_upstream_kind(link["upstreamKind"])
    if len(candidates) != 1:
        raise InvalidRequest(EXTERNAL_HARNESS_MESSAGE)
    harness = candidates[0]
    generation = registry.generation(harness.id)
    with transaction.atomic():
        source = _lock_unchanged(seen.key, seen)
        point = _fork_point(source, entry_id)
    native_turn_id = point.entry.body.get("nativeTurnId")
    if not native_turn_id:
        raise InvalidRequest(f"entry has no native turn to fork at: {entry_id}")

    def source_unchanged() -> None:
        current = Session.objects.filter(key=source.key).first()
        if (
            current is None
            or current.initialization_pending
            or (current.session_id, current.lifecycle_revision) != (source.session_id, source.lifecycle_revision)
            or links.link_read(source.key, source.agent_id) != link
            or registry.generation(harness.id) != generation
        ):
            raise InitializationError(f"Session {source.key} changed during fork initialization")

    request = ForkRequest(
        target_key=keys.dashboard_key(source.agent_id),
        agent_id=source.agent_id,
        source={
            "agentId": source.agent_id,
            "sessionId": source.session_id,
            "sessionKey": source.key,
            "entryId": entry_id,
            "nativeTurnId": native_turn_id,
        },
        upstream=link,
        assert_current=source_unchanged,
    )
    with initialization_source(source_unchanged):
        result = harness.fork_session(request)
    if result.status != "created":
        if result.cause is not None and not isinstance(result.cause, GatewayError):
            # An unexpected failure (a database error, a bug): the caller gets a reference, the log the cause.
            raise internal_error(
                logger,
                f"sessions.fork of {seen.key}",
                summary="fork failed",
                exc=result.cause,
                details={"reason": result.code},
            ) from result.cause
        error_class = Unavailable if result.code == "upstream-unavailable" else InvalidRequest
        raise error_class(result.message or "fork failed", details={"reason": result.code}) from result.cause
    child = Session.objects.filter(key=result.key).first()
    if child is not None:
        events.publish_session_changed_on_commit(child, reason="fork")
    # The harness committed the child in its own initialization; the audit row follows it.
    _audit_fork(actor, source, entry_id, result.key)
    return {"sessionKey": result.key, "editorText": result.editor_text or _text(point.entry)}


def session_adopt_requested(*, request: SessionsAdoptParams) -> Session:
    """sessions.adopt as a caller asks for it (RPC and JSON API): keys normalized under the agent."""
    agent = keys.normalize_agent_id(request.agentId)
    return session_adopt(
        thread_id=request.threadId,
        harness_id=request.harness,
        agent_id=agent,
        key=keys.canonical_key(request.key, agent) if request.key else None,
        label=(request.label or "").strip(),
    )


def session_adopt(*, thread_id: str, harness_id: str, agent_id: str, key: str | None, label: str = "") -> Session:
    harness = registry.get(harness_id)
    if harness is None or not hasattr(harness, "adopt_thread"):
        raise InvalidRequest(f"unknown agent harness: {harness_id}")
    try:
        created = harness.adopt_thread(thread_id=thread_id, agent_id=agent_id, key=key, label=label)
    except GatewayError:
        raise
    except Exception as error:
        # The guarded rollback already ran. An unexpected failure (a database error, a bug): the
        # caller gets a reference, the log the cause.
        raise internal_error(
            logger,
            f"sessions.adopt of {thread_id}",
            summary="session initialization failed",
            details={"reason": "initialization-failed"},
        ) from error
    return created.session
