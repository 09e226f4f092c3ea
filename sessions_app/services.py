"""All writes of sessions_app: sessions, transcript appends, chat runs.

One transaction per service, as small as the read-modify-write it protects. The session row is
the lock that serializes everything touching one conversation (transcript ``seq``, turn order,
reset); events and task dispatch happen only after commit.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from openclaw_site.gateway.exceptions import Conflict, InvalidRequest, NotFound, Unavailable
from openclaw_site.gateway.services import Actor, audit

from . import events, keys
from .models import (
    TERMINAL_RUN_STATUSES,
    Run,
    RunStatus,
    Session,
    SessionWindow,
    TranscriptEvent,
    WindowReason,
    new_id,
)

# --- sessions -------------------------------------------------------------------------------


def _locked(key: str) -> Session:
    """The session row, locked for the rest of the transaction (serializes one conversation)."""
    session = Session.objects.select_for_update(no_key=True).filter(key=key).first()
    if session is None:
        raise NotFound(f"session not found: {key}")
    return session


def _check_expected(session: Session, expected_session_id: str | None, expected_revision: str | None) -> None:
    if (expected_session_id is not None and expected_session_id != session.session_id) or (
        expected_revision is not None and expected_revision != session.lifecycle_revision
    ):
        raise Conflict(
            f"Session {session.key} changed; retry.",
            details={
                "code": "SESSION_CHANGED",
                "sessionId": session.session_id,
                "lifecycleRevision": session.lifecycle_revision,
            },
        )


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


@dataclass(frozen=True)
class CreatedSession:
    session: Session
    worktree: dict | None = None
    run: Run | None = None


def session_create_requested(
    *,
    key: str | None = None,
    agent_id: str | None = None,
    label: str | None = None,
    display_name: str | None = None,
    category: str | None = None,
    model: str | None = None,
    parent_session_key: str | None = None,
    worktree: bool = False,
    worktree_base_ref: str | None = None,
    worktree_name: str | None = None,
    cwd: str | None = None,
    exec_node: str | None = None,
    message: str | None = None,
    idempotency_key: str | None = None,
) -> CreatedSession:
    """sessions.create as a caller asks for it (RPC and JSON API).

    1. Validate the workspace options (OpenClaw's messages, in its order).
    2. Canonicalize the key under the agent; no key means a fresh dashboard key.
    3. Create the session, with its git worktree when asked (removed again if the insert fails).
    4. With ``message``, submit the first turn (idempotency key defaults to ``create-<sessionId>``).
    """
    from . import workspace  # workspace builds on the services above

    agent = keys.normalize_agent_id(agent_id)
    plan = workspace.plan_session_workspace(
        cwd=cwd,
        worktree=worktree,
        worktree_base_ref=worktree_base_ref,
        worktree_name=worktree_name,
        exec_node=exec_node,
    )
    session_key = keys.canonical_key(key, agent) if key else keys.dashboard_key(agent)
    spec = SessionSpec(
        key=session_key,
        agent_id=keys.agent_of(session_key),
        label=(label or "").strip(),
        display_name=(display_name or "").strip(),
        category=(category or "").strip(),
        model=(model or "").strip(),
        parent_session_key=keys.canonical_key(parent_session_key, agent)
        if parent_session_key
        else keys.main_key(agent),
        cwd=plan.cwd,
    )
    session, created_worktree = workspace.create_session_with_workspace(spec=spec, plan=plan)
    run = None
    if message is not None:
        run_id = idempotency_key or f"create-{session.session_id}"
        run = run_submit(session_key=session.key, message=message, idempotency_key=run_id).run
    return CreatedSession(session=session, worktree=created_worktree, run=run)


PATCHABLE = {"label", "displayName", "category", "archived", "pinned", "model"}


def session_patch(
    *,
    key: str,
    changes: dict[str, Any],
    expected_session_id: str | None = None,
    expected_lifecycle_revision: str | None = None,
) -> Session:
    if not changes:
        raise InvalidRequest("sessions.patch needs at least one change")
    unknown = set(changes) - PATCHABLE
    if unknown:
        raise InvalidRequest(f"sessions.patch cannot change: {', '.join(sorted(unknown))}")
    with transaction.atomic():
        session = _locked(key)
        _check_expected(session, expected_session_id, expected_lifecycle_revision)
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
            session.model = (changes["model"] or "").strip()[:200]
        session.save()
        events.publish_session_changed_on_commit(session, reason="patch")
    return session


def session_reset(
    *,
    key: str,
    reason: str = "reset",
    expected_session_id: str | None = None,
    expected_lifecycle_revision: str | None = None,
    actor: Actor | None = None,
) -> Session:
    """Start a new transcript generation: new sessionId and lifecycleRevision, queued turns fail.

    With ``actor`` (admin, operator UI) the reset is also written to the audit log.
    """
    with transaction.atomic():
        session = _locked(key)
        _check_expected(session, expected_session_id, expected_lifecycle_revision)
        if session.initialization_pending:
            raise Unavailable(f"Session {key} is initializing; retry later.", retryable=True)
        if Run.objects.filter(session=session, status=RunStatus.RUNNING).exists():
            raise Unavailable("Reset is unavailable while the agent is working.", retryable=True)
        previous = session.session_id
        session.session_id = new_id()
        session.lifecycle_revision = new_id()
        session.status = ""
        session.save()
        SessionWindow.objects.create(
            id=session.session_id, session=session, previous_session_id=previous, reason=WindowReason.RESET
        )
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
) -> bool:
    """Delete a session with its windows, transcript and runs; a running turn blocks deletion.

    A session owned by an agent harness is deleted through the harness's deletion participant
    (which removes its binding after the commit); a pending one only by clearing its initialization.
    """
    with transaction.atomic():
        session = Session.objects.select_for_update(no_key=True).filter(key=key).first()
        if session is None:
            return False
        _check_expected(session, expected_session_id, expected_lifecycle_revision)
        if Run.objects.filter(session=session, status=RunStatus.RUNNING).exists():
            raise Unavailable("Delete is unavailable while the agent is working; abort the run first.", retryable=True)
        if session.initialization_pending:
            raise Unavailable(f"Session {key} is initializing; retry later.", retryable=True)
        if not session.agent_harness_id:
            events.publish_session_changed_on_commit(session, reason="delete", deleted=True)
            session.delete()
            return True
        expected = {k: v for k, v in Session.objects.filter(pk=session.pk).values().first().items()}
    from .initialization import delete_session_guarded

    if not delete_session_guarded(key=key, expected=expected, purpose="delete"):
        raise Conflict(f"Session {key} changed; retry.", details={"code": "SESSION_CHANGED"})
    return True


# --- transcript -----------------------------------------------------------------------------


def transcript_append(
    *,
    window: SessionWindow,
    type: str,
    body: dict[str, Any],
    idempotency_key: str | None = None,
) -> TranscriptEvent:
    """Append after the current leaf of a window whose session row the caller holds locked
    (``window`` read inside that transaction).

    A repeated append with the same idempotency key returns the existing event unchanged.
    """
    if idempotency_key is not None:
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
    return event


def message_body(role: str, text: str, **extra: Any) -> dict[str, Any]:
    return {
        "role": role,
        "content": [{"type": "text", "text": text}],
        "timestamp": int(timezone.now().timestamp() * 1000),
        **{k: v for k, v in extra.items() if v is not None},
    }


# --- chat runs ------------------------------------------------------------------------------

_CONTROL_CHARS = {c for c in map(chr, range(32)) if c not in "\n\t\r"} | {"\x7f"}


def clean_message(message: str) -> str:
    """NFC-normalized text without control characters; NUL bytes and empty text are refused."""
    if "\x00" in message:
        raise InvalidRequest("message must not contain null bytes")
    text = "".join(ch for ch in unicodedata.normalize("NFC", message) if ch not in _CONTROL_CHARS)
    if not text.strip():
        raise InvalidRequest("message or attachment required")
    return text


@dataclass(frozen=True)
class SubmitResult:
    run: Run
    created: bool


def run_submit(*, session_key: str, message: str, idempotency_key: str, origin_channel: str = "") -> SubmitResult:
    """Record a turn (queued); a repeated idempotency key is the same run, whatever its state."""
    text = clean_message(message)
    existing = Run.objects.filter(run_id=idempotency_key).first()
    if existing is not None:
        if existing.session_key != session_key:
            raise Conflict("idempotencyKey already used for another session", details={"code": "RUN_KEY_REUSED"})
        return SubmitResult(existing, created=False)
    try:
        with transaction.atomic():
            session = _locked(session_key)
            if session.initialization_pending:
                raise Unavailable(f"Session {session_key} is initializing; retry later.", retryable=True)
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
            session.save(update_fields=["last_interaction_at", "last_run_id", "updated_at"])
            events.dispatch_turn_on_commit(run.run_id)
    except IntegrityError:
        # A concurrent send with the same key won the insert.
        existing = Run.objects.get(run_id=idempotency_key)
        if existing.session_key != session_key:
            raise Conflict("idempotencyKey already used for another session") from None
        return SubmitResult(existing, created=False)
    return SubmitResult(run, created=True)


def session_for_turn(*, key: str) -> Session:
    """The session a chat turn goes to; the agent's main session is created on first use."""
    session = Session.objects.filter(key=key).first()
    if session is None and keys.is_main_key(key):
        session = session_ensure_main(agent_id=keys.agent_of(key))
    if session is None:
        raise NotFound(f"session not found: {key}")
    return session


def chat_send(
    *,
    session_key: str,
    message: str,
    idempotency_key: str,
    expected_session_id: str | None = None,
    origin_channel: str = "",
) -> SubmitResult:
    """chat.send: submit a turn to the session (see :func:`session_for_turn` and :func:`run_submit`)."""
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
    history: list[tuple[str, str]]  # (role, text) of the active path, the new user message last


def run_claim(*, run_id: str, worker: str) -> ClaimedTurn | None:
    """Start a queued turn if its session is idle; None when it is not this caller's to run.

    In one transaction under the session lock: no other turn of the session may be running;
    queued → running by compare-and-set; the user message is appended to the transcript (so
    concurrent sends give U1 A1 U2 A2, never U1 U2 A1 A2).
    """
    with transaction.atomic():
        run = Run.objects.filter(run_id=run_id).select_related("session").first()
        if run is None or run.status != RunStatus.QUEUED:
            return None
        session = _locked(run.session.key)
        if Run.objects.filter(session=session, status=RunStatus.RUNNING).exists():
            return None  # the running turn dispatches this one when it ends
        if run.window_id != session.session_id:
            Run.objects.filter(pk=run.pk, status=RunStatus.QUEUED).update(
                status=RunStatus.ERROR, error="session was reset before the turn started", ended_at=timezone.now()
            )
            return None
        now = timezone.now()
        claimed = Run.objects.filter(pk=run.pk, status=RunStatus.QUEUED).update(
            status=RunStatus.RUNNING, worker=worker, started_at=now, heartbeat_at=now
        )
        if claimed != 1:
            return None
        window = SessionWindow.objects.get(pk=run.window_id)
        user_event = transcript_append(
            window=window,
            type="message",
            body=message_body("user", run.message, idempotencyKey=f"{run.run_id}:user"),
            idempotency_key=f"{run.run_id}:user",
        )
        Run.objects.filter(pk=run.pk).update(user_event_id=user_event.event_id)
        session.status = "running"
        session.save(update_fields=["status", "updated_at"])
        run.refresh_from_db()
        history = active_path_texts(window)
        events.publish_session_changed_on_commit(session, reason="send", phase="start", run_id=run.run_id)
    return ClaimedTurn(run=run, session=session, history=history)


def active_path_texts(window: SessionWindow) -> list[tuple[str, str]]:
    """The model's context: the newest messages of the active path, oldest first."""
    from django.conf import settings

    from .selectors import active_path

    texts = []
    for event in active_path(window, limit=settings.OPENCLAW_MODEL["CONTEXT_MESSAGES"]):
        body = event.body
        text = "".join(part.get("text", "") for part in body.get("content", []) if part.get("type") == "text")
        texts.append((body.get("role", "user"), text))
    return texts


def run_heartbeat(*, run_id: str) -> bool:
    """Proof of life; False when the run is no longer running (aborted, swept)."""
    return bool(Run.objects.filter(run_id=run_id, status=RunStatus.RUNNING).update(heartbeat_at=timezone.now()))


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


def run_finish(*, run_id: str, outcome: TurnOutcome, emitter: events.TurnEmitter | None = None) -> Run | None:
    """Record the end of a running turn and, in the same commit, its assistant message.

    Nothing half-written: either the message and the terminal status commit together, or
    neither. Returns None when the run was no longer running (swept meanwhile). After commit:
    the terminal events, the run-finished notification, and the next queued turn of the session.
    """
    with transaction.atomic():
        run = Run.objects.filter(run_id=run_id).select_related("session").first()
        if run is None:
            return None
        session = _locked(run.session.key)
        run.refresh_from_db()
        if run.status != RunStatus.RUNNING:
            return None
        assistant_event_id = ""
        if outcome.text and outcome.status in (RunStatus.OK, RunStatus.ABORTED) and run.window_id == session.session_id:
            window = SessionWindow.objects.get(pk=run.window_id)
            event = transcript_append(
                window=window,
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
            )
            assistant_event_id = event.event_id
        now = timezone.now()
        Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
            status=outcome.status,
            output_text=outcome.text,
            stop_reason=outcome.stop_reason,
            error=outcome.error[:4000],
            error_kind=outcome.error_kind,
            usage=outcome.usage,
            model_provider=outcome.model_provider,
            model=outcome.model,
            assistant_event_id=assistant_event_id,
            ended_at=now,
        )
        session.status = {"ok": "done", "error": "failed", "aborted": "killed"}[outcome.status]
        if outcome.usage:
            session.input_tokens += int(outcome.usage.get("input") or 0)
            session.output_tokens += int(outcome.usage.get("output") or 0)
        if not session.model and outcome.model:
            session.model, session.model_provider = outcome.model, outcome.model_provider
        session.save()
        run.refresh_from_db()
        next_run = (
            Run.objects.filter(session=session, status=RunStatus.QUEUED)
            .order_by("created_at")
            .values_list("run_id", flat=True)
            .first()
        )
        events.publish_turn_end_on_commit(run, session, emitter)
        events.publish_session_changed_on_commit(session, reason="send", phase="end", run_id=run.run_id)
        if next_run is not None:
            events.dispatch_turn_on_commit(next_run)
    return run


def run_abort(*, session_key: str, run_id: str | None = None, actor: Actor | None = None) -> list[str]:
    """Stop the session's queued and running turns (or just ``run_id``); returns the runs asked to stop.

    Queued turns end at once; a running turn is asked to stop (the runner keeps its partial text
    as an aborted message). With ``actor`` (admin, operator UI) a stop is also written to the audit log.
    """
    with transaction.atomic():
        session = _locked(session_key)
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
                run.status = RunStatus.ABORTED
                events.publish_turn_end_on_commit(run, session)
            else:
                Run.objects.filter(pk=run.pk).update(abort_requested_at=now)
                events.request_abort_on_commit(run)
        if actor is not None and runs:
            outcomes = {run.run_id: "aborted" if run.status == RunStatus.ABORTED else "stop requested" for run in runs}
            audit(actor, "session.run.abort", "session", session.key, {"runs": outcomes})
    return [run.run_id for run in runs]


def runs_recover(*, stale_before, reason: str, workers: list[str] | None = None) -> list[str]:
    """Fail running turns whose worker stopped: no heartbeat since ``stale_before`` (or a dead worker).

    Their sessions' queued turns are dispatched again.
    """
    candidates = Run.objects.filter(status=RunStatus.RUNNING)
    if workers is not None:
        candidates = candidates.filter(worker__in=workers)
    else:
        candidates = candidates.filter(heartbeat_at__lt=stale_before)
    failed = []
    for run_id in list(candidates.values_list("run_id", flat=True)):
        with transaction.atomic():
            run = Run.objects.filter(run_id=run_id).select_related("session").first()
            session = _locked(run.session.key)
            updated = Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
                status=RunStatus.ERROR, error=reason, error_kind="interrupted", ended_at=timezone.now()
            )
            if not updated:
                continue
            run.refresh_from_db()
            session.status = "failed"
            session.save(update_fields=["status", "updated_at"])
            events.publish_turn_end_on_commit(run, session)
            next_run = Run.objects.filter(session=session, status=RunStatus.QUEUED).order_by("created_at").first()
            if next_run is not None:
                events.dispatch_turn_on_commit(next_run.run_id)
            failed.append(run_id)
    return failed


def runs_recover_dead_gateways() -> list[str]:
    """Fail turns that ran inside a gateway process that is gone (embedded profile restart)."""
    from openclaw_site.gateway import runtime
    from openclaw_site.gateway.selectors import live_process_boot_ids

    live = {f"gateway:{boot}" for boot in live_process_boot_ids()}
    live.add(f"gateway:{runtime.BOOT_ID}")
    workers = set(
        Run.objects.filter(status=RunStatus.RUNNING, worker__startswith="gateway:").values_list("worker", flat=True)
    )
    dead = sorted(workers - live)
    if not dead:
        return []
    return runs_recover(
        stale_before=None, workers=dead, reason="run interrupted: the gateway process running it stopped"
    )


def runs_redispatch_stuck(*, queued_before) -> list[str]:
    """Queued turns of idle sessions that nobody started (a lost task): dispatch them again."""
    stuck = []
    for run in Run.objects.filter(status=RunStatus.QUEUED, created_at__lt=queued_before).order_by("created_at"):
        busy = Run.objects.filter(session_id=run.session_id, status=RunStatus.RUNNING).exists()
        if not busy:
            with transaction.atomic():
                events.dispatch_turn_on_commit(run.run_id)
            stuck.append(run.run_id)
    return stuck


def run_terminal(run: Run) -> bool:
    return run.status in TERMINAL_RUN_STATUSES
