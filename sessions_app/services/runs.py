"""Writes of chat runs: submit, claim, heartbeat, finish, abort, recovery, and turn dispatch.

A turn is a guarded state machine in the database (queued → running → ok | error | aborted); every
transition is a compare-and-set on ``status`` under the session lock, so a duplicate task, a sweep
or an abort racing with a runner change nothing that is not theirs. Which runner executes a turn
is asked of the placement port (:mod:`sessions_app.ports`) once the run is committed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from approvals_app.gate import ABORTED_REASON as RUN_ABORTED
from approvals_app.services import exec_approvals_cancel_for_run
from gateway import background, metrics, sql_reads, state, task_consumers
from gateway.audit import Actor, audit
from gateway.conf import gateway_setting
from gateway.exceptions import Busy, Conflict, InvalidRequest
from gateway.executor_leases import lease_ttl_s, stopped_executors
from gateway.selectors import live_process_boot_ids
from openclaw_client.agent.loop import openai_messages

from .. import events
from ..events import TurnEmitter
from ..message_subscriptions import publish_message_on_commit
from ..models import Run, RunStatus, Session, SessionWindow, ToolArtifact, TranscriptEvent, new_id
from ..ports import SessionAction, placements
from ..selectors import history_message, newest_message_bodies
from .rows import session_write
from .sessions import session_for_turn, session_lock
from .transcripts import message_body, transcript_append

logger = logging.getLogger(__name__)

# --- turn dispatch and the abort flag -------------------------------------------------------

# Scoped to one execution (run id + start time), so a flag can never stop a later run that
# reuses the id after its session was deleted; cleared when the run ends.
ABORT_KEY = "sessions:run-abort:{}:{}"


# The gateway's own turn (sessions_app/tasks.py), named: the task module imports these services.
GATEWAY_TURN_TASK = "sessions.run_turn"


def dispatch_turn_on_commit(run_id: str, session: Session) -> None:
    """Once the transaction commits, hand the run to the runner of its placed session, else to the gateway's
    own turn task (a Celery worker in production, a thread of the gateway when embedded)."""

    def dispatch() -> None:
        runner = placements().runner_for(session)
        if runner is not None:
            runner.dispatch(run_id)
        else:
            background.dispatch_task_now(GATEWAY_TURN_TASK, run_id)

    transaction.on_commit(dispatch)


def abort_key(run: Run) -> str:
    return ABORT_KEY.format(run.run_id, int(run.started_at.timestamp() * 1000) if run.started_at else 0)


def request_abort_on_commit(run: Run) -> None:
    # The runner polls this flag between chunks (and while waiting on the provider).
    key = abort_key(run)
    transaction.on_commit(lambda: cache.set(key, 1, timeout=24 * 3600))


def abort_requested(run: Run) -> bool:
    return bool(cache.get(abort_key(run)))


def _clear_abort_on_commit(run: Run) -> None:
    key = abort_key(run)
    transaction.on_commit(lambda: cache.delete(key))


# --- chat runs ------------------------------------------------------------------------------

# Control characters but tab, line feed and carriage return (OpenClaw strips the same), as UTF-8 bytes: no
# byte of a multi-byte character is below 0x80, so deleting these bytes deletes exactly those characters.
_CONTROL_BYTES = bytes([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])


def _without_control_characters(text: str) -> str:
    # A message may be a megabyte (schemas.MAX_MESSAGE_CHARS): C-speed passes over bytes, each short
    # (a pattern over the text held the interpreter lock 3-60 ms per MB, a character loop 140 ms).
    encoded = text.encode("utf-8", "surrogatepass")
    kept = encoded.translate(None, _CONTROL_BYTES)
    return text if len(kept) == len(encoded) else kept.decode("utf-8", "surrogatepass")


# PostgreSQL stores no NUL in text or jsonb: a tool's output or a node's message with one would fail its write.
NUL_REPLACEMENT = "\ufffd"
# Token counts a usage may carry: a JavaScript client's exact integers, never negative.
MAX_TOKEN_COUNT = 2**53 - 1


def without_nul(value: Any) -> Any:
    """``value`` (JSON: a model's, a tool's or a node's) with every NUL in its strings and keys made U+FFFD."""
    if isinstance(value, str):
        return value.replace("\x00", NUL_REPLACEMENT) if "\x00" in value else value
    if isinstance(value, list):
        return [without_nul(item) for item in value]
    if isinstance(value, dict):
        return {without_nul(key): without_nul(item) for key, item in value.items()}
    return value


def bounded_usage(usage: Any) -> dict | None:
    """A turn's token usage as it may be stored and added to the session's totals: the counts that are integers from
    0 to 2**53 - 1 and the cost figures that are finite non-negative numbers (one level of nesting, as in
    ``cost: {total, …}``); anything else a node or a provider sent is left out."""
    if not isinstance(usage, dict):
        return None
    kept: dict[str, Any] = {}
    for key, value in usage.items():
        if not isinstance(key, str):
            continue
        if isinstance(value, dict):
            nested = {name: figure for name, figure in value.items() if isinstance(name, str) and _figure(figure)}
            if nested:
                kept[key] = nested
        elif _figure(value):
            kept[key] = value
    return kept or None


def _figure(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return 0 <= value <= MAX_TOKEN_COUNT
    return isinstance(value, float) and math.isfinite(value) and 0 <= value <= MAX_TOKEN_COUNT


def _token_count(usage: dict | None, key: str) -> int:
    value = (usage or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def clean_message(message: str) -> str:
    """NFC-normalized text without control characters; NUL bytes and empty text are refused."""
    if "\x00" in message:
        raise InvalidRequest("message must not contain null bytes")
    text = _without_control_characters(unicodedata.normalize("NFC", message))
    if not text.strip():
        raise InvalidRequest("message or attachment required")
    return text


@dataclass(frozen=True)
class SubmitResult:
    run: Run
    created: bool


def submitted_before(*, session_key: str, idempotency_key: str) -> SubmitResult | None:
    """The run a repeated idempotency key names (whatever its state); a key of another session is refused."""
    existing = Run.objects.filter(run_id=idempotency_key).first()
    if existing is None:
        return None
    if existing.session_key != session_key:
        raise Conflict("idempotencyKey already used for another session", details={"code": "RUN_KEY_REUSED"})
    return SubmitResult(existing, created=False)


def run_submit(*, session_key: str, message: str, idempotency_key: str, origin_channel: str = "") -> SubmitResult:
    """Record a turn (queued); a repeated idempotency key is the same run, whatever its state."""
    text = clean_message(message)
    existing = submitted_before(session_key=session_key, idempotency_key=idempotency_key)
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            session = session_lock(session_key)
            if session.initialization_pending:
                raise Busy(f"Session {session_key} is initializing; retry later.", retryable=True)
            placements().check_action(session, SessionAction.SEND)
            run = Run.objects.create(
                run_id=idempotency_key,
                session=session,
                session_key=session.key,
                window_id=session.session_id,
                message=text,
                status=RunStatus.QUEUED,
                origin_channel=origin_channel,
            )
            session.last_interaction_at = timezone.now()
            session.last_run_id = run.run_id
            session_write(session, "last_interaction_at", "last_run_id")
            dispatch_turn_on_commit(run.run_id, session)
    except IntegrityError:
        # A concurrent send with the same key won the insert.
        return submitted_concurrently(session_key=session_key, idempotency_key=idempotency_key)
    return SubmitResult(run, created=True)


def submitted_concurrently(*, session_key: str, idempotency_key: str) -> SubmitResult:
    """After an insert lost to a concurrent send with the same key: that send's run (or the refusal of a key of
    another session)."""
    existing = Run.objects.get(run_id=idempotency_key)
    if existing.session_key != session_key:
        raise Conflict("idempotencyKey already used for another session") from None
    return SubmitResult(existing, created=False)


def chat_send(
    *,
    session_key: str,
    message: str,
    idempotency_key: str,
    expected_session_id: str | None = None,
    origin_channel: str = "",
) -> SubmitResult:
    """chat.send: submit a turn to the session (see :func:`session_for_turn` and :func:`run_submit`).

    One transaction: a main session created for this turn is not kept when the turn is refused.
    """
    clean_message(message)  # refused before anything is written
    with transaction.atomic():
        session = session_for_turn(key=session_key)
        if expected_session_id is not None and expected_session_id != session.session_id:
            raise InvalidRequest(f"sessionId does not match the current session of {session.key}")
        return run_submit(
            session_key=session.key, message=message, idempotency_key=idempotency_key, origin_channel=origin_channel
        )


@dataclass(frozen=True)
class ClaimedTurn:
    run: Run
    session: Session
    # The model's context: OpenAI chat messages of the active path (tool calls and results included), the
    # new user message last.
    history: list[dict]


def run_claim(*, run_id: str, executor: str) -> ClaimedTurn | None:
    """Start a queued turn if its session is idle; None when it is not this caller's to run.

    In one transaction under the session lock: no other turn of the session may be running;
    queued → running by compare-and-set; the user message is appended to the transcript (so
    concurrent sends give U1 A1 U2 A2, never U1 U2 A1 A2).
    """
    with transaction.atomic():
        # First in line: a task may come before the older turn's (a backed-up queue, two workers); the older turn
        # starts first, and its end dispatches this one.
        locked = _lock_queued_run_of_idle_session(run_id, first_in_line=True)
        if locked is None:
            return None
        run, session = locked
        if run.window_id != session.session_id:
            Run.objects.filter(pk=run.pk, status=RunStatus.QUEUED).update(
                status=RunStatus.ERROR, error="session was reset before the turn started", ended_at=timezone.now()
            )
            return None
        user_event = transcript_append(
            session=session,
            window=run.window,
            type="message",
            body=message_body("user", run.message, idempotencyKey=f"{run.run_id}:user"),
            idempotency_key=f"{run.run_id}:user",
            # Appended only by the claim of a queued run, and taken back with a claim that fails.
            first_time=True,
        )
        now = timezone.now()
        claim = {
            "status": RunStatus.RUNNING,
            "executor": executor,
            "started_at": now,
            "heartbeat_at": now,
            "user_event_id": user_event.event_id,
        }
        # Under the session lock the status read above cannot change; the compare-and-set stays the
        # guard all the same, and a lost one takes the appended user message back with it.
        if Run.objects.filter(pk=run.pk, status=RunStatus.QUEUED).update(**claim) != 1:
            transaction.set_rollback(True)
            return None
        for field, value in claim.items():
            setattr(run, field, value)
        session.status = "running"
        session_write(session, "status")
        history = active_path_messages(run.window)
        events.publish_session_changed_on_commit(session, reason="send", phase="start", run_id=run.run_id)
    return ClaimedTurn(run=run, session=session, history=history)


def _lock_queued_run_of_idle_session(run_id: str, *, first_in_line: bool = False) -> tuple[Run, Session] | None:
    """:func:`_lock_run` when the run is still queued and no other turn of its session runs (that turn dispatches
    this one when it ends) and, ``first_in_line``, none queued before it waits (in the order of
    :func:`_next_queued_run_id`); else None. Inside the caller's transaction."""
    locked = _lock_run(run_id)
    if locked is None:
        return None
    run, session = locked
    blocking = Q(status=RunStatus.RUNNING)
    if first_in_line:
        earlier = Q(created_at__lt=run.created_at) | Q(created_at=run.created_at, run_id__lt=run.run_id)
        blocking |= Q(earlier, status=RunStatus.QUEUED)
    if run.status != RunStatus.QUEUED or Run.objects.filter(blocking, session=session).exists():
        return None
    return run, session


def _next_queued_run_id(session: Session) -> str | None:
    return (
        Run.objects.filter(session=session, status=RunStatus.QUEUED)
        .order_by("created_at", "run_id")
        .values_list("run_id", flat=True)
        .first()
    )


def _lock_run(run_id: str) -> tuple[Run, Session] | None:
    """The run (with its window) and its session, the session row locked first: the run is read
    after the lock, so no transition of it (each one takes that lock) can race with the caller.

    Two statements: the lock finds the session through the run, so it needs no read before it. Both are SQL
    text (``gateway.sql_reads``): every turn takes this twice, at its claim and at its end.
    """
    # The session row is locked (no_key: runs referencing it may still be inserted) before the run is read.
    found = sql_reads.instances(Session, _SESSION_FIELDS, _lock_session_of_run_sql(connection.vendor), [run_id])
    if not found:
        return None
    (session,) = found
    alias, rows = sql_reads.read(Run, _RUN_WITH_WINDOW_SQL, [run_id, session.pk])
    if not rows:
        return None
    split = len(_RUN_FIELDS)
    (run,) = sql_reads.from_rows(Run, _RUN_FIELDS, [rows[0][:split]], alias=alias)
    (run.window,) = sql_reads.from_rows(SessionWindow, _WINDOW_FIELDS, [rows[0][split:]], alias=alias)
    run.session = session
    return run, session


_SESSION_FIELDS = tuple(Session._meta.concrete_fields)
_RUN_FIELDS = tuple(Run._meta.concrete_fields)
_WINDOW_FIELDS = tuple(SessionWindow._meta.concrete_fields)
_RUN_WITH_WINDOW_SQL = (
    f"SELECT {sql_reads.columns(_RUN_FIELDS, table='r')}, {sql_reads.columns(_WINDOW_FIELDS, table='w')} "
    f'FROM "{Run._meta.db_table}" r JOIN "{SessionWindow._meta.db_table}" w ON w."id" = r."window_id" '
    'WHERE r."run_id" = %s AND r."session_id" = %s'
)


@functools.cache
def _lock_session_of_run_sql(vendor: str) -> str:
    # SQLite has no row locks: a write transaction there holds the database's write lock (BEGIN IMMEDIATE).
    lock = " FOR NO KEY UPDATE" if vendor == "postgresql" else ""
    return (
        f'SELECT {sql_reads.columns(_SESSION_FIELDS)} FROM "{Session._meta.db_table}" WHERE "id" IN '
        f'(SELECT "session_id" FROM "{Run._meta.db_table}" WHERE "run_id" = %s) ORDER BY "id"{lock}'
    )


def active_path_messages(window: SessionWindow) -> list[dict]:
    """The model's context: the newest messages of the active path, oldest first, as chat messages."""
    return openai_messages(newest_message_bodies(window, limit=settings.OPENCLAW_MODEL["CONTEXT_MESSAGES"]))


def _append_to_running_run(run_id: str, body: dict, *, idempotency_key: str) -> bool:
    """PostgreSQL: append a message of a running run in one statement (one round trip, one commit), as
    :func:`run_record_message` does in five. False when nothing was written. The statement also reads the
    session's event fields, so the message goes out as ``session.message`` without another round trip.

    Every row the statement decides on is locked (the session first, as every writer of its runs and
    transcript takes it; then the run and the window): under READ COMMITTED a locked row is re-read at its
    newest committed version once the lock is held, so the run's status, the session's window and the
    window's leaf are not the statement's snapshot, taken before it waited. (The run takes FOR SHARE, not
    FOR KEY SHARE: a key-share lock is granted past a committed update that left the key alone, without that
    re-read, and the run's status would be the snapshot's.) A key recorded meanwhile by another writer meets the unique
    constraint, as on the general path.
    """
    event_id = new_id()
    with connection.cursor() as cursor:
        cursor.execute(
            _APPEND_TO_RUNNING_RUN_SQL,
            {"run_id": run_id, "event_id": event_id, "body": json.dumps(body), "key": idempotency_key},
        )
        row = cursor.fetchone()
    if row is None:
        return False
    seq, *fields = row
    session = Session(**dict(zip(_EVENT_FIELDS, fields, strict=True)))
    event = TranscriptEvent(seq=seq, event_id=event_id, type="message", body=body)
    publish_message_on_commit(session, event, history_message(event))
    return True


# The session's columns a per-session event shows (message_subscriptions.session_snapshot_fields).
_EVENT_FIELDS = (
    "key",
    "agent_id",
    "session_id",
    "updated_at",
    "label",
    "display_name",
    "category",
    "archived_at",
    "pinned_at",
    "created_via",
    "parent_session_key",
    "status",
    "model",
    "model_provider",
    "input_tokens",
    "output_tokens",
    "last_run_id",
)


_APPEND_TO_RUNNING_RUN_SQL = f"""
WITH locked_session AS (
    SELECT s."id", {", ".join(f's."{name}"' for name in _EVENT_FIELDS if name != "session_id")}, s."session_id"
    FROM "{Session._meta.db_table}" s
    WHERE s."id" IN (SELECT "session_id" FROM "{Run._meta.db_table}" WHERE "run_id" = %(run_id)s)
    FOR NO KEY UPDATE
), running AS (
    SELECT r."window_id" FROM "{Run._meta.db_table}" r JOIN locked_session s ON s."id" = r."session_id"
    WHERE r."run_id" = %(run_id)s AND r."status" = '{RunStatus.RUNNING.value}' AND r."window_id" = s."session_id"
    FOR SHARE OF r
), current_leaf AS (
    SELECT w."id", w."next_seq", w."leaf_event_id" FROM "{SessionWindow._meta.db_table}" w
    JOIN running ON running."window_id" = w."id"
    WHERE NOT EXISTS (
        SELECT 1 FROM "{TranscriptEvent._meta.db_table}" e
        WHERE e."window_id" = w."id" AND e."idempotency_key" = %(key)s
    )
    FOR NO KEY UPDATE OF w
), advanced AS (
    UPDATE "{SessionWindow._meta.db_table}" w
    SET "next_seq" = c."next_seq" + 1, "leaf_event_id" = %(event_id)s, "message_count" = w."message_count" + 1
    FROM current_leaf c WHERE w."id" = c."id"
    RETURNING w."id", c."next_seq" AS "seq", c."leaf_event_id" AS "parent_id"
), inserted AS (
    INSERT INTO "{TranscriptEvent._meta.db_table}"
        ("window_id", "seq", "event_id", "parent_id", "type", "body", "idempotency_key", "created_at")
    SELECT a."id", a."seq", %(event_id)s, a."parent_id", 'message', %(body)s::jsonb, %(key)s, statement_timestamp()
    FROM advanced a
    RETURNING "seq"
)
SELECT i."seq", {", ".join(f's."{name}"' for name in _EVENT_FIELDS)} FROM inserted i CROSS JOIN locked_session s
"""


def run_heartbeat(*, run_id: str) -> bool:
    """Proof of life; False when the run is no longer running (aborted, swept)."""
    return bool(Run.objects.filter(run_id=run_id, status=RunStatus.RUNNING).update(heartbeat_at=timezone.now()))


ARTIFACT_NOTE = "[the whole output ({total} bytes) is kept as artifact {artifact_id}]"


def run_record_message(
    *,
    run_id: str,
    body: dict,
    message_key: str,
    full_text: str | None = None,
    total_bytes: int = 0,
    first_time: bool = False,
) -> dict | None:
    """Append one complete message of a running turn (an assistant message asking for tools, or a tool's
    result) to its transcript, as the turn goes: each step is durable once it happened.

    ``message_key`` names the message within its run (its step and place, ``s3.r1``), so a repeated record
    changes nothing. ``full_text``: the whole output of a tool whose message carries a truncated copy; it is
    kept as a :class:`ToolArtifact` and the message says where. Returns the body as stored, or None when the
    run is no longer running (aborted and ended, swept as dead) or its session was reset: nothing is written.
    ``first_time``: the caller proves the key was never recorded (the loop that claimed the run numbers its own
    steps), so it is not looked up first; the unique constraint still refuses a repeat.
    """
    # Which turn the message belongs to (as the turn's final assistant message says too).
    stored = without_nul({**body, "runId": run_id})
    if full_text is not None:
        full_text = without_nul(full_text)
    if full_text is None and connection.vendor == "postgresql":
        if _append_to_running_run(run_id, stored, idempotency_key=f"{run_id}:{message_key}"):
            return stored
        # Nothing written: the run no longer runs, or the key is already recorded (a node's resend).
        # The general path below tells which, under the same locks.
    with transaction.atomic():
        locked = _lock_run(run_id)
        if locked is None:
            return None
        run, session = locked
        if run.status != RunStatus.RUNNING or run.window_id != session.session_id:
            return None
        if full_text is not None and stored.get("role") == "toolResult":
            size = len(full_text.encode("utf-8"))
            artifact, _ = ToolArtifact.objects.get_or_create(
                run=run,
                message_key=message_key,
                defaults={
                    "session_key": session.key,
                    "tool_call_id": str(stored.get("toolCallId", ""))[:200],
                    "tool_name": str(stored.get("toolName", ""))[:64],
                    "content": full_text,
                    "size_bytes": size,
                    "total_bytes": max(total_bytes, size),
                },
            )
            note = ARTIFACT_NOTE.format(total=artifact.total_bytes, artifact_id=artifact.id)
            content, details = stored.get("content"), stored.get("details")
            stored["content"] = [*(content if isinstance(content, list) else []), {"type": "text", "text": f"\n{note}"}]
            stored["details"] = {**(details if isinstance(details, dict) else {}), "artifactId": artifact.id}
        event = transcript_append(
            session=session,
            window=run.window,
            type="message",
            body=stored,
            idempotency_key=f"{run_id}:{message_key}",
            first_time=first_time,
        )
    return event.body


@dataclass(frozen=True)
class TurnOutcome:
    status: str  # ok | error | aborted
    text: str = ""
    stop_reason: str = ""
    error: str = ""
    error_kind: str = ""
    usage: dict | None = None
    model_provider: str = ""
    model: str = ""


def run_finish(*, run_id: str, outcome: TurnOutcome, emitter: TurnEmitter | None = None) -> Run | None:
    """Record the end of a running turn and, in the same commit, its assistant message.

    Nothing half-written: either the message and the terminal status commit together, or
    neither. Returns None when the run was no longer running (swept meanwhile). After commit:
    the terminal events, the run-finished notification, and the next queued turn of the session.

    The outcome may be a node's: its text and error lose NUL characters, and its usage keeps only bounded figures.
    """
    outcome = dataclasses.replace(
        outcome,
        text=without_nul(outcome.text or ""),
        error=without_nul(outcome.error or ""),
        usage=bounded_usage(outcome.usage),
    )
    with transaction.atomic():
        locked = _lock_run(run_id)
        if locked is None:
            return None
        run, session = locked
        if run.status != RunStatus.RUNNING:
            return None
        assistant_event_id = ""
        if outcome.text and outcome.status in (RunStatus.OK, RunStatus.ABORTED) and run.window_id == session.session_id:
            event = transcript_append(
                session=session,
                window=run.window,
                type="message",
                body=message_body(
                    "assistant",
                    outcome.text,
                    stopReason="aborted" if outcome.status == RunStatus.ABORTED else (outcome.stop_reason or "stop"),
                    provider=outcome.model_provider or None,
                    model=outcome.model or None,
                    usage=outcome.usage,
                    runId=run.run_id,
                ),
                idempotency_key=f"{run.run_id}:assistant",
                # Appended only by the finish of a running run, which leaves it running no more.
                first_time=True,
            )
            assistant_event_id = event.event_id
        ended = {
            "status": outcome.status,
            "output_text": outcome.text,
            "stop_reason": outcome.stop_reason,
            "error": outcome.error[:4000],
            "error_kind": outcome.error_kind,
            "usage": outcome.usage,
            "model_provider": outcome.model_provider,
            "model": outcome.model,
            "assistant_event_id": assistant_event_id,
            "ended_at": timezone.now(),
        }
        # The guard of every transition; under the session lock it cannot lose, and if it did the
        # assistant message goes back with it.
        if Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(**ended) != 1:
            transaction.set_rollback(True)
            return None
        for field, value in ended.items():
            setattr(run, field, value)
        session.status = {"ok": "done", "error": "failed", "aborted": "killed"}[outcome.status]
        if outcome.usage:
            session.input_tokens += _token_count(outcome.usage, "input")
            session.output_tokens += _token_count(outcome.usage, "output")
        if not session.model and outcome.model:
            session.model, session.model_provider = outcome.model, outcome.model_provider
        session_write(session, "status", "input_tokens", "output_tokens", "model", "model_provider")
        next_run = _next_queued_run_id(session)
        events.publish_turn_end_on_commit(run, session, emitter)
        _clear_abort_on_commit(run)
        if run.status == RunStatus.ERROR:
            _log_failed_turn_on_commit(run, session, reason=run.error, kind=run.error_kind)
        events.publish_session_changed_on_commit(session, reason="send", phase="end", run_id=run.run_id)
        if next_run is not None:
            dispatch_turn_on_commit(next_run, session)
    _record_turn_end(run)
    return run


def _record_turn_end(run: Run) -> None:
    usage = run.usage or {}
    metrics.record_turn_end(
        status=run.status,
        seconds=(run.ended_at - run.started_at).total_seconds() if run.started_at and run.ended_at else None,
        model=run.model,
        tokens_in=int(usage.get("input") or 0),
        tokens_out=int(usage.get("output") or 0),
    )


def _log_failed_turn_on_commit(run: Run, session: Session, *, reason: str, kind: str) -> None:
    """A failed turn's line, once the failure is recorded (the run and session name it, also from a sweep)."""
    transaction.on_commit(
        lambda: logger.warning(
            "turn %s failed (%s): %s",
            run.run_id,
            kind or "unknown",
            reason,
            extra={"run_id": run.run_id, "session_key": session.key},
        )
    )


def run_abort(*, session_key: str, run_id: str | None = None, actor: Actor | None = None) -> list[str]:
    """Stop the session's queued and running turns (or just ``run_id``); returns the runs asked to stop.

    Queued turns end at once; a running turn is asked to stop (the runner keeps its partial text
    as an aborted message). With ``actor`` (admin, operator UI) a stop is also written to the audit log.
    """
    with transaction.atomic():
        session = session_lock(session_key)
        active = Run.objects.filter(session=session, status__in=[RunStatus.QUEUED, RunStatus.RUNNING])
        if run_id is not None:
            target = Run.objects.filter(run_id=run_id).first()
            if target is None or target.session_id != session.pk:
                raise InvalidRequest("runId does not match sessionKey")
            active = active.filter(run_id=run_id)
        runs = list(active.order_by("created_at"))
        now = timezone.now()
        for run in runs:
            if run.status == RunStatus.QUEUED:
                Run.objects.filter(pk=run.pk, status=RunStatus.QUEUED).update(
                    status=RunStatus.ABORTED, stop_reason="aborted", abort_requested_at=now, ended_at=now
                )
                # As stored: the turn's end events and agent.wait's answer are built from it.
                run.status, run.stop_reason = RunStatus.ABORTED, "aborted"
                run.abort_requested_at = run.ended_at = now
                _record_turn_end(run)
                events.publish_turn_end_on_commit(run, session)
                _clear_abort_on_commit(run)
            else:
                Run.objects.filter(pk=run.pk).update(abort_requested_at=now)
                request_abort_on_commit(run)
        if actor is not None and runs:
            outcomes = {run.run_id: "aborted" if run.status == RunStatus.ABORTED else "stop requested" for run in runs}
            audit(actor, "session.run.abort", "session", session.key, {"runs": outcomes})
    return [run.run_id for run in runs]


def run_end_running(*, session: Session) -> Run | None:
    """End the session's running turn now as ``aborted`` (a reset in chat, OpenClaw's ``/reset`` during a turn);
    the caller holds the session lock. Returns that run, or None when none was running.

    Its runner is asked to stop as by ``chat.abort`` and records nothing more (each of its writes checks that the
    run still runs); the partial text it held is not kept. The end events go out after commit, as for any end.
    """
    run = Run.objects.filter(session=session, status=RunStatus.RUNNING).first()
    if run is None:
        return None
    now = timezone.now()
    ended = {"status": RunStatus.ABORTED, "stop_reason": "aborted", "abort_requested_at": now, "ended_at": now}
    # Under the session lock no runner transition can race this; the compare-and-set stays the guard.
    if Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(**ended) != 1:
        return None
    for field, value in ended.items():
        setattr(run, field, value)
    request_abort_on_commit(run)
    transaction.on_commit(lambda: exec_approvals_cancel_for_run(run.run_id, RUN_ABORTED))
    session.status = "killed"
    session.save(update_fields=["status", "updated_at"])
    events.publish_turn_end_on_commit(run, session)
    transaction.on_commit(lambda: _record_turn_end(run))
    return run


def runs_recover(*, stale_before, reason: str, executors: list[str] | None = None) -> list[str]:
    """Fail running turns whose executor stopped: no heartbeat since ``stale_before`` (or a dead executor).

    Their sessions' queued turns are dispatched again.
    """
    candidates = Run.objects.filter(status=RunStatus.RUNNING)
    if executors is not None:
        candidates = candidates.filter(executor__in=executors)
    else:
        candidates = candidates.filter(heartbeat_at__lt=stale_before)
    failed = []
    for run_id in list(candidates.values_list("run_id", flat=True)):
        with transaction.atomic():
            run = Run.objects.filter(run_id=run_id).select_related("session").first()
            session = session_lock(run.session.key)
            updated = Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
                status=RunStatus.ERROR, error=reason, error_kind="interrupted", ended_at=timezone.now()
            )
            if not updated:
                continue
            # What the dead turn waited on is withdrawn with it (consoles drop the card; nobody decides in vain).
            transaction.on_commit(lambda run_id=run_id: exec_approvals_cancel_for_run(run_id, RUN_ABORTED))
            run.refresh_from_db()
            _record_turn_end(run)
            _log_failed_turn_on_commit(run, session, reason=reason, kind="interrupted")
            session.status = "failed"
            session_write(session, "status")
            events.publish_turn_end_on_commit(run, session)
            _clear_abort_on_commit(run)
            next_run = Run.objects.filter(session=session, status=RunStatus.QUEUED).order_by("created_at").first()
            if next_run is not None:
                dispatch_turn_on_commit(next_run.run_id, session)
            failed.append(run_id)
    return failed


def runs_recover_dead_gateways() -> list[str]:
    """Fail turns that ran inside a gateway process that is gone (embedded profile restart)."""
    live = {f"gateway:{boot}" for boot in live_process_boot_ids()}
    live.add(f"gateway:{state.BOOT_ID}")
    executors = set(
        Run.objects.filter(status=RunStatus.RUNNING, executor__startswith="gateway:").values_list("executor", flat=True)
    )
    dead = sorted(executors - live)
    if not dead:
        return []
    return runs_recover(
        stale_before=None, executors=dead, reason="run interrupted: the gateway process running it stopped"
    )


def runs_redispatch_stuck(*, queued_before) -> list[str]:
    """Queued turns of idle sessions that nobody started (a lost task): dispatch each such session's oldest one
    again (its end dispatches the next, so the session's turns keep their order)."""
    stuck = []
    queued = Run.objects.filter(status=RunStatus.QUEUED, created_at__lt=queued_before).select_related("session")
    busy = set(Run.objects.filter(status=RunStatus.RUNNING).values_list("session_id", flat=True))
    for run in queued.order_by("created_at", "run_id"):
        if run.session_id in busy:
            continue
        busy.add(run.session_id)  # its oldest queued turn is on its way
        with transaction.atomic():
            dispatch_turn_on_commit(run.run_id, run.session)
        logger.warning(
            "turn %s dispatched again: queued with nobody running it",
            run.run_id,
            extra={"run_id": run.run_id, "session_key": run.session.key},
        )
        stuck.append(run.run_id)
    return stuck


# A queued turn failed because no Celery worker consumes the turn queue (runs_fail_unclaimed).
WORKER_MISSING = "worker-missing"


def run_fail_queued(*, run_id: str, reason: str, kind: str) -> Run | None:
    """End a queued turn that never started as an error (``reason``, ``kind``); None when it is not queued any more
    or its session is running another turn (that turn's end dispatches it).

    The compare-and-set on ``queued`` under the session lock is the same guard as the claim's: a worker claiming
    the run at the same moment either started it (and this changes nothing) or finds it ended (and runs nothing).
    The user message stays out of the transcript, as with a queued turn that is aborted: only a started turn
    appends it. The usual end follows after commit: the chat ``error`` and agent ``lifecycle`` events, agent.wait's
    answer, the failed turn's log line, and the session's next queued turn dispatched.
    """
    with transaction.atomic():
        locked = _lock_queued_run_of_idle_session(run_id)
        if locked is None:
            return None
        run, session = locked
        ended = {"status": RunStatus.ERROR, "error": reason[:4000], "error_kind": kind, "ended_at": timezone.now()}
        if Run.objects.filter(pk=run.pk, status=RunStatus.QUEUED).update(**ended) != 1:
            return None
        for field, value in ended.items():
            setattr(run, field, value)
        session.status = "failed"
        session_write(session, "status")
        events.publish_turn_end_on_commit(run, session)
        _clear_abort_on_commit(run)
        _log_failed_turn_on_commit(run, session, reason=run.error, kind=kind)
        events.publish_session_changed_on_commit(session, reason="send", phase="end", run_id=run.run_id)
        next_run = _next_queued_run_id(session)
        if next_run is not None:
            dispatch_turn_on_commit(next_run, session)
    _record_turn_end(run)
    return run


# How old the broker's answer may be when runs_fail_unclaimed fails turns on it (its rounds are a second apart).
UNCLAIMED_RECHECK_S = 5.0


def runs_fail_unclaimed() -> list[str]:
    """Celery task mode: fail the queued turns of idle sessions that no worker took within
    ``TURN_PICKUP_TIMEOUT_S`` while no worker consumes the turn queue (``gateway.task_consumers``), counted from the
    later of the turn's queueing and the moment the queue was found unconsumed, so that a worker restarted within
    the timeout loses no turn. Run by the gateway loop every ``EXECUTOR_WATCH_INTERVAL_MS`` (``lifecycle.on_watch``):
    nothing else could, since without a worker the sweeps of beat do not run either.

    A turn running in a Celery worker proves a worker is there (a ``solo`` pool answers no broadcast while it runs
    a task): then nothing fails.
    """
    timeout_s = gateway_setting("TURN_PICKUP_TIMEOUT_S")
    if not timeout_s or background.task_mode() != "celery":
        return []
    consumers = task_consumers.consumer_watch.current()
    if not consumers.worker_missing or consumers.unconsumed_since_ms is None:
        return []
    now = timezone.now()
    pickup = timedelta(seconds=timeout_s)
    if now - datetime.fromtimestamp(consumers.unconsumed_since_ms / 1000, tz=UTC) < pickup:
        return []
    running = Run.objects.filter(status=RunStatus.RUNNING)
    if running.filter(executor__startswith=background.CELERY_EXECUTOR_PREFIX).exists():
        return []
    busy = set(running.values_list("session_id", flat=True))
    queued = Run.objects.filter(status=RunStatus.QUEUED, created_at__lt=now - pickup).exclude(session_id__in=busy)
    candidates = list(queued.order_by("created_at", "run_id").values_list("run_id", flat=True))
    if not candidates:
        return []
    # The cached answer may be a check interval old, and a worker may have come back since: turns are failed only
    # on an answer of the last few seconds (else one is asked for now, and the next round decides).
    confirmed = task_consumers.consumer_watch.recent(UNCLAIMED_RECHECK_S)
    if confirmed is None or not confirmed.worker_missing:
        return []
    reason = confirmed.message()
    failed = []
    for run_id in candidates:
        if run_fail_queued(run_id=run_id, reason=reason, kind=WORKER_MISSING) is not None:
            failed.append(run_id)
    return failed


def worker_stopped_reason() -> str:
    return f"run interrupted: its worker process stopped (no lease renewal for {lease_ttl_s()} s)"


@dataclass(frozen=True)
class StoppedWorkersRecovery:
    failed: list[str]
    redispatched: list[str]


def runs_recover_stopped_workers() -> StoppedWorkersRecovery:
    """Fail the running turns of Celery worker processes that stopped renewing their lease (killed, frozen), and
    dispatch again the oldest queued turn of every idle session: a stopped worker may have taken a turn's task
    without starting it, and late acknowledgement gives that task back only when the broker notices (RabbitMQ: at
    once; Redis: after its visibility timeout). A task delivered twice starts its turn once (the claim's
    compare-and-set). Run by the gateway loop every ``EXECUTOR_WATCH_INTERVAL_MS`` (``lifecycle.on_watch``).
    """
    executors = Run.objects.filter(status=RunStatus.RUNNING).values_list("executor", flat=True).distinct()
    stopped = stopped_executors(executors)
    if not stopped:
        return StoppedWorkersRecovery(failed=[], redispatched=[])
    logger.warning("worker process(es) stopped renewing their lease: %s", ", ".join(sorted(stopped)))
    # The idle sessions first: the sessions of the failed turns are still busy here, and failing a turn dispatches
    # its session's next one itself.
    redispatched = runs_redispatch_stuck(queued_before=timezone.now())
    failed = runs_recover(stale_before=None, executors=sorted(stopped), reason=worker_stopped_reason())
    return StoppedWorkersRecovery(failed=failed, redispatched=redispatched)
