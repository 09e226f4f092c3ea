"""Transcript writes: one append after the leaf (turns), and bulk appends (imports, forks).

A window's transcript is linear: every append follows the current leaf. Bulk writes are one
INSERT per batch, not one round trip per event: a fork's cost grows with the history only
through the rows it writes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..message_subscriptions import publish_message_on_commit
from ..models import Session, SessionWindow, TranscriptEvent, new_id
from ..selectors import history_message

BATCH_SIZE = 500


@dataclass(frozen=True)
class ImportedMessage:
    role: str
    text: str
    timestamp: int
    extra: dict[str, Any]


def _message_body(message: ImportedMessage) -> dict[str, Any]:
    return {
        "role": message.role,
        "content": [{"type": "text", "text": message.text}],
        "timestamp": message.timestamp,
        **message.extra,
    }


def append_many(
    *,
    window_id: str,
    session_key: str,
    bodies: Sequence[dict[str, Any]],
    event_ids: Sequence[str] | None = None,
    guard: Callable[[], None] | None = None,
) -> int:
    """Append message events after the window's leaf, in one transaction under the session lock."""
    with transaction.atomic():
        Session.objects.select_for_update(no_key=True).filter(key=session_key).first()
        # Locked: seq and leaf of the window belong to whoever holds the session row.
        if guard is not None:
            guard()
        window = SessionWindow.objects.get(pk=window_id)
        parent, seq, events = window.leaf_event_id, window.next_seq, []
        for index, body in enumerate(bodies):
            event_id = event_ids[index] if event_ids is not None else new_id()
            events.append(
                TranscriptEvent(window=window, seq=seq, event_id=event_id, parent_id=parent, type="message", body=body)
            )
            parent, seq = event_id, seq + 1
        TranscriptEvent.objects.bulk_create(events, batch_size=BATCH_SIZE)
        SessionWindow.objects.filter(pk=window.pk).update(
            next_seq=seq, leaf_event_id=parent, message_count=window.message_count + len(events)
        )
        if guard is not None:
            guard()
    return len(events)


def import_messages(
    *, window_id: str, session_key: str, messages: Sequence[ImportedMessage], guard: Callable[[], None] | None = None
) -> int:
    return append_many(
        window_id=window_id, session_key=session_key, bodies=[_message_body(m) for m in messages], guard=guard
    )


def transcript_append(
    *,
    session: Session,
    window: SessionWindow,
    type: str,
    body: dict[str, Any],
    idempotency_key: str | None = None,
    first_time: bool = False,
) -> TranscriptEvent:
    """Append after the current leaf of a window whose session row the caller holds locked
    (``session`` and ``window`` read inside that transaction); a message goes out as ``session.message`` to the
    session's subscribers once it commits.

    A repeated append with the same idempotency key returns the existing event unchanged.
    ``first_time``: the caller's own guard (a run's state, under the same lock) proves the key was
    never appended, so it is not looked up; the unique constraint still refuses a repeat.
    """
    if idempotency_key is not None and not first_time:
        existing = TranscriptEvent.objects.filter(window=window, idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing
    event = TranscriptEvent.objects.create(
        window=window,
        seq=window.next_seq,
        parent_id=window.leaf_event_id,
        type=type,
        body=body,
        idempotency_key=idempotency_key,
    )
    window.next_seq += 1
    window.leaf_event_id = event.event_id
    if type == "message":
        window.message_count += 1
    SessionWindow.objects.filter(pk=window.pk).update(
        next_seq=window.next_seq, leaf_event_id=window.leaf_event_id, message_count=window.message_count
    )
    if type == "message":
        publish_message_on_commit(session, event, history_message(event))
    return event


def message_body(role: str, text: str, **extra: Any) -> dict[str, Any]:
    return {
        "role": role,
        "content": [{"type": "text", "text": text}],
        "timestamp": int(timezone.now().timestamp() * 1000),
        **{k: v for k, v in extra.items() if v is not None},
    }
