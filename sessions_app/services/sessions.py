"""Writes of session rows: create, patch, reset (a new transcript generation), delete.

The session row is the lock that serializes everything touching one conversation (transcript
``seq``, turn order, reset); :func:`session_lock` takes it. Events go out only after commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from gateway.audit import Actor, audit
from gateway.exceptions import Busy, Conflict, InvalidRequest, NotFound

from .. import events, keys, selectors
from ..models import Run, RunStatus, Session, SessionWindow, WindowReason, new_id
from ..ports import SessionAction, placements
from .initialization import delete_session_guarded
from .rows import check_expected, session_delete_row, session_write


def session_lock(key: str) -> Session:
    """The session row, locked for the rest of the transaction (serializes one conversation)."""
    session = Session.objects.select_for_update(no_key=True).filter(key=key).first()
    if session is None:
        raise NotFound(f"session not found: {key}")
    return session


@dataclass(frozen=True)
class SessionSpec:
    key: str
    agent_id: str
    label: str = ""
    display_name: str = ""
    category: str = ""
    model: str = ""
    model_provider: str = ""
    cwd: str = ""
    worktree: dict | None = None
    parent_session_key: str = ""
    created_via: str = "operator"
    initialization_pending: bool = False
    fork_source_session_key: str = ""
    fork_source_session_id: str = ""
    fork_source_entry_id: str = ""


def session_create(*, spec: SessionSpec) -> Session:
    """Insert a session and its first transcript window; an existing key is a Conflict."""
    try:
        with transaction.atomic():
            session = Session.objects.create(
                key=spec.key,
                agent_id=spec.agent_id,
                label=spec.label,
                display_name=spec.display_name,
                category=spec.category,
                model=spec.model,
                model_provider=spec.model_provider,
                cwd=spec.cwd,
                worktree=spec.worktree,
                parent_session_key=spec.parent_session_key,
                created_via=spec.created_via,
                initialization_pending=spec.initialization_pending,
                fork_source_session_key=spec.fork_source_session_key,
                fork_source_session_id=spec.fork_source_session_id,
                fork_source_entry_id=spec.fork_source_entry_id,
            )
            SessionWindow.objects.create(id=session.session_id, session=session, reason=WindowReason.INITIAL)
            events.publish_session_changed_on_commit(session, reason="create")
    except IntegrityError:
        raise Conflict(f"session already exists: {spec.key}", details={"code": "SESSION_EXISTS"}) from None
    return session


def session_ensure_main(*, agent_id: str) -> Session:
    """The agent's main session, created on first use (it is the default conversation)."""
    key = keys.main_key(agent_id)
    existing = Session.objects.filter(key=key).first()
    if existing is not None:
        return existing
    try:
        return session_create(spec=SessionSpec(key=key, agent_id=agent_id, created_via="internal"))
    except Conflict:
        return Session.objects.get(key=key)  # created concurrently


def session_for_turn(*, key: str) -> Session:
    """The session a chat turn goes to; the agent's main session is created on first use."""
    session = Session.objects.filter(key=key).first()
    if session is None and keys.is_main_key(key):
        session = session_ensure_main(agent_id=keys.agent_of(key))
    if session is None:
        raise NotFound(f"session not found: {key}")
    return session


# The wire name of each field sessions.patch may change, and its column.
PATCHED_FIELDS = {
    "label": "label",
    "displayName": "display_name",
    "category": "category",
    "archived": "archived_at",
    "pinned": "pinned_at",
    "model": "model",
}


def session_patch(
    *,
    key: str,
    changes: dict[str, Any],
    expected_session_id: str | None = None,
    expected_lifecycle_revision: str | None = None,
    expected_revision: int | None = None,
    actor: Actor | None = None,
) -> Session:
    """Change display and model fields; with ``expected_revision``, only the row the caller read.

    With ``actor`` (operator UI) the change is also written to the audit log."""
    if not changes:
        raise InvalidRequest("sessions.patch needs at least one change")
    unknown = set(changes) - PATCHED_FIELDS.keys()
    if unknown:
        raise InvalidRequest(f"sessions.patch cannot change: {', '.join(sorted(unknown))}")
    with transaction.atomic():
        session = session_lock(key)
        check_expected(
            session,
            session_id=expected_session_id,
            lifecycle_revision=expected_lifecycle_revision,
            revision=expected_revision,
        )
        now = timezone.now()
        if "label" in changes:
            session.label = (changes["label"] or "").strip()[:200]
        if "displayName" in changes:
            session.display_name = (changes["displayName"] or "").strip()[:200]
        if "category" in changes:
            session.category = (changes["category"] or "").strip()[:100]
        if "archived" in changes:
            session.archived_at = now if changes["archived"] else None
        if "pinned" in changes:
            session.pinned_at = now if changes["pinned"] else None
        if "model" in changes:
            session.model = model_id_of(changes["model"] or "", session)[:200]
        session_write(session, *(PATCHED_FIELDS[name] for name in changes))
        if actor is not None:
            audit(actor, "session.patch", "session", key, {"changes": changes, "revision": session.revision})
        events.publish_session_changed_on_commit(session, reason="patch")
    return session


def model_id_of(reference: str, session: Session) -> str:
    """The model id a ``sessions.patch {model}`` names: OpenClaw's clients send ``provider/model`` as their
    ``models.list`` shows it (the TUI's picker does), and the provider's own prefix is not part of the id it takes.
    Anything else is kept whole: a model id may hold slashes of its own (``meta-llama/…``)."""
    reference = reference.strip()
    provider, slash, model = reference.partition("/")
    if slash and model and provider.lower() == selectors.resolved_model(session)["modelProvider"].lower():
        return model
    return reference


def session_reset(
    *,
    key: str,
    reason: str = "reset",
    expected_session_id: str | None = None,
    expected_lifecycle_revision: str | None = None,
    expected_revision: int | None = None,
    actor: Actor | None = None,
) -> Session:
    """Start a new transcript generation: new sessionId and lifecycleRevision, queued turns fail.

    With ``actor`` (admin, operator UI) the reset is also written to the audit log.
    """
    with transaction.atomic():
        session = session_lock(key)
        check_expected(
            session,
            session_id=expected_session_id,
            lifecycle_revision=expected_lifecycle_revision,
            revision=expected_revision,
        )
        if session.initialization_pending:
            raise Busy(f"Session {key} is initializing; retry later.", retryable=True)
        if Run.objects.filter(session=session, status=RunStatus.RUNNING).exists():
            raise Busy("Reset is unavailable while the agent is working.", retryable=True)
        placements().check_action(session, SessionAction.RESET)
        previous = session.session_id
        session.session_id = new_id()
        session.lifecycle_revision = new_id()
        session.status = ""
        session_write(session, "session_id", "lifecycle_revision", "status")
        SessionWindow.objects.create(
            id=session.session_id, session=session, previous_session_id=previous, reason=WindowReason.RESET
        )
        placements().session_renewed(session, previous)
        now = timezone.now()
        failed = Run.objects.filter(session=session, status=RunStatus.QUEUED).update(
            status=RunStatus.ERROR, error="session was reset before the turn started", ended_at=now
        )
        if actor is not None:
            data = {"reason": reason, "previousSessionId": previous, "sessionId": session.session_id}
            audit(actor, "session.reset", "session", key, {**data, "failedQueuedRuns": failed})
        events.publish_session_changed_on_commit(session, reason="new" if reason == "new" else "reset")
    return session


def session_delete(
    *,
    key: str,
    expected_session_id: str | None = None,
    expected_lifecycle_revision: str | None = None,
    expected_revision: int | None = None,
    expected_updated_at_ms: int | None = None,
    archived_only: bool = False,
    actor: Actor | None = None,
) -> bool:
    """Delete a session with its windows, transcript and runs; a running turn blocks deletion, and with
    ``archived_only`` (OpenClaw's ``archivedOnly``) a session that is not archived.

    A session owned by an agent harness is deleted through the harness's deletion participant
    (which removes its binding after the commit); a pending one only by clearing its initialization.
    With ``actor`` (operator UI) the deletion is also written to the audit log.
    """
    with transaction.atomic():
        session = Session.objects.select_for_update(no_key=True).filter(key=key).first()
        if session is None:
            return False
        check_expected(
            session,
            session_id=expected_session_id,
            lifecycle_revision=expected_lifecycle_revision,
            revision=expected_revision,
            updated_at_ms=expected_updated_at_ms,
        )
        if archived_only and session.archived_at is None:
            raise InvalidRequest(f"Session {key} is not archived. Archive it first, then delete it.")
        if Run.objects.filter(session=session, status=RunStatus.RUNNING).exists():
            raise Busy("Delete is unavailable while the agent is working; abort the run first.", retryable=True)
        if session.initialization_pending:
            raise Busy(f"Session {key} is initializing; retry later.", retryable=True)
        placements().check_action(session, SessionAction.DELETE)
        deleted = {"sessionId": session.session_id, "revision": session.revision}
        if not session.agent_harness_id:
            session_delete_row(session)
            if actor is not None:
                audit(actor, "session.delete", "session", key, deleted)
            events.publish_session_changed_on_commit(session, reason="delete", deleted=True)
            return True
        expected = {k: v for k, v in Session.objects.filter(pk=session.pk).values().first().items()}
    if not delete_session_guarded(key=key, expected=expected, purpose="delete"):
        raise Conflict(f"Session {key} changed; retry.", details={"code": "SESSION_CHANGED"})
    if actor is not None:
        audit(actor, "session.delete", "session", key, deleted)
    return True
