"""How a session row is written: every write bumps its ``revision``, by compare-and-set.

The revision is the row's version as clients see it (``revision`` on ``sessions.list`` /
``sessions.describe`` rows and ``sessions.changed``): a client that read revision N and sends it back as
``expectedRevision`` changes the session only if nobody wrote the row since. Every write of a session
row goes through :func:`session_write` (patch, reset, a turn's submit, start and end, a dead turn's
recovery, readiness of an initialization) and a guarded delete removes only the revision it checked;
the transcript (its own windows and ``seq``) and the placement (its ``generation``) are versioned apart
and do not write the row.

Writers hold the row lock (``sessions.session_lock``) while they read and write; the compare-and-set is
the guard all the same (a writer that took no lock, SQLite's database-wide lock), the lock only makes
it win.
"""

from __future__ import annotations

from django.db.models import F
from django.utils import timezone

from gateway.exceptions import Conflict, NotFound

from ..models import Session


def session_changed(
    session: Session, *, expected_revision: int | None = None, current_revision: int | None = None
) -> Conflict:
    """The refusal of a guarded mutation whose session moved on; the details carry what is current.

    With ``expected_revision`` the message names it beside the current revision (``current_revision``, or the
    one ``session`` was read at)."""
    current = session.revision if current_revision is None else current_revision
    message = f"Session {session.key} changed; retry."
    if expected_revision is not None and expected_revision != current:
        revisions = f"expected revision {expected_revision}, current revision {current}"
        message = f"Session {session.key} changed: {revisions}; retry."
    return Conflict(
        message,
        details={
            "code": "SESSION_CHANGED",
            "sessionId": session.session_id,
            "lifecycleRevision": session.lifecycle_revision,
            "revision": current,
        },
    )


def check_expected(
    session: Session,
    *,
    session_id: str | None = None,
    lifecycle_revision: str | None = None,
    revision: int | None = None,
    updated_at_ms: int | None = None,
) -> None:
    """Refuse (:func:`session_changed`) when the locked row is not what the caller says it read."""
    if (
        (session_id is not None and session_id != session.session_id)
        or (lifecycle_revision is not None and lifecycle_revision != session.lifecycle_revision)
        or (revision is not None and revision != session.revision)
        or (updated_at_ms is not None and updated_at_ms != int(session.updated_at.timestamp() * 1000))
    ):
        raise session_changed(session, expected_revision=revision)


def session_write(session: Session, *fields: str) -> None:
    """Store ``fields`` of ``session`` (and ``updated_at``) and bump its revision, only if the row is still at
    the revision ``session`` was read at; otherwise :func:`session_changed` and nothing is written.

    ``session`` is updated in place (its new ``revision`` and ``updated_at``), so the caller's events and
    payloads show the row as stored."""
    now = timezone.now()
    values = {name: getattr(session, name) for name in fields}
    written = Session.objects.filter(pk=session.pk, revision=session.revision).update(
        **values, updated_at=now, revision=F("revision") + 1
    )
    if written != 1:
        raise _lost(session)
    session.updated_at = now
    session.revision += 1


def session_delete_row(session: Session) -> None:
    """Delete the row (its windows, transcript and runs cascade) only at the revision ``session`` was read at."""
    deleted, _ = Session.objects.filter(pk=session.pk, revision=session.revision).delete()
    if not deleted:
        raise _lost(session)


def _lost(session: Session) -> Conflict | NotFound:
    """Why a compare-and-set on ``session`` changed nothing: another writer moved the row on, or removed it."""
    current = Session.objects.filter(pk=session.pk).values_list("revision", flat=True).first()
    if current is None:
        return NotFound(f"session not found: {session.key}")
    return session_changed(session, expected_revision=session.revision, current_revision=current)
