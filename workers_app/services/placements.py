"""The placement store (workers.md §1.4): every change is one compare-and-set in one transaction.

Each operation reads the row, checks the rule it enforces, and writes with ``UPDATE … WHERE
session = ? AND state = ? AND generation = ?``; a writer that lost a race (the row moved on)
changes nothing and gets the exact "changed" error. Every successful change appends a
:class:`PlacementHistory` row in the same transaction. Error messages are OpenClaw's.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q

from gateway.audit import Actor
from gateway.exceptions import Conflict, InvalidRequest
from gateway.redaction import operator_text
from sessions_app.models import Session

from ..events import placement_changed_on_commit
from ..models import (
    RECOVERY_ERROR_LIMIT,
    TRANSITIONS,
    WORKER_FIELDS,
    EnvironmentState,
    ExecutionMode,
    Placement,
    PlacementHistory,
    PlacementState,
    TurnClaimOwner,
    WorkerEnvironment,
)

logger = logging.getLogger(__name__)

S = PlacementState
MAX_GENERATION = 2**53 - 1
FORCED_WORKER_ABANDONMENT_ERROR = "Worker result abandoned by forced operator teardown"
# Who drives the dispatch or move in flight, and to where (recovery and joining retries read them).
DRIVER_FIELDS = ("dispatch_target", "dispatch_owner")
PATCHABLE = (*WORKER_FIELDS, "recovery_error", "terminal_reason", *DRIVER_FIELDS)
CLAIM_FIELDS = (
    "turn_claim_owner",
    "turn_claim_id",
    "turn_claim_run_id",
    "turn_claim_generation",
    "turn_claim_owner_epoch",
)


def now_ms() -> int:
    return int(time.time() * 1000)


def bounded_worker_error(text: str) -> str:
    """An error as the placement keeps it (and every client and page shows it): operator text (no secret, no path
    on this host), whitespace collapsed, at most 1024 UTF-16 units."""
    redacted = operator_text(text)
    collapsed = " ".join(redacted.split())
    if len(collapsed.encode("utf-16-le")) <= RECOVERY_ERROR_LIMIT * 2:
        return collapsed
    kept = collapsed.encode("utf-16-le")[: RECOVERY_ERROR_LIMIT * 2]
    return kept.decode("utf-16-le", errors="ignore")


# Who changed a placement, as the history shows it (a connection, an operator, the sweep); the
# gateway's actor, so that a recovery action's audit row names the Django user who took it.
SYSTEM = Actor("gateway")


def _label(session: Session) -> str:
    return session.session_id


def _history(
    session: Session, placement: Placement, *, from_state: str, actor: Actor, reason: str = "", at_ms: int
) -> None:
    """The history row of a change, its ``sessions.changed`` event and its log line once the change commits."""
    placement_changed_on_commit(session, placement)
    transition = (
        placement.session_key,
        from_state or "none",
        placement.state,
        placement.generation,
        actor.label,
        reason or "-",
    )
    transaction.on_commit(
        lambda: logger.info(
            "placement of session %s: %s -> %s (generation %s) by %s: %s",
            *transition,
            extra={"session_key": transition[0]},
        )
    )
    PlacementHistory.objects.create(
        session_id=placement.pk,
        session_key=placement.session_key,
        from_state=from_state,
        to_state=placement.state,
        generation=placement.generation,
        environment_id=placement.environment_id or "",
        actor=actor.label,
        reason=reason,
        at_ms=at_ms,
    )


def _read(session: Session) -> Placement | None:
    return Placement.objects.filter(pk=session.pk).first()


def _next_generation(placement: Placement) -> int:
    if placement.generation >= MAX_GENERATION:
        raise InvalidRequest("Worker session placement generation is exhausted")
    return placement.generation + 1


def _write(placement: Placement, *, expected_state: str, expected_generation: int, changes: dict[str, Any]) -> int:
    """The compare-and-set itself; returns the rows it changed (0: somebody else moved the row)."""
    return Placement.objects.filter(pk=placement.pk, state=expected_state, generation=expected_generation).update(
        **changes
    )


def _apply(placement: Placement, changes: dict[str, Any]) -> Placement:
    for name, value in changes.items():
        setattr(placement, name, value)
    return placement


def _worker_claim_released(placement: Placement) -> dict[str, Any]:
    """A worker's turn claim ends with its ownership (a local claim stays: it finishes on the gateway)."""
    return dict.fromkeys(CLAIM_FIELDS) if placement.turn_claim_owner == TurnClaimOwner.WORKER else {}


def _moved(placement: Placement, to_state: str, at: int, **fields: Any) -> dict[str, Any]:
    """The changes of a state change: the next generation and both timestamps, plus ``fields``."""
    return {
        **fields,
        "state": to_state,
        "generation": _next_generation(placement),
        "updated_at_ms": at,
        "state_changed_at_ms": at,
    }


def _commit(
    session: Session,
    placement: Placement,
    *,
    changes: dict[str, Any],
    conflict: str,
    actor: Actor,
    reason: str,
    at: int,
    expected_state: str | None = None,
    expected_generation: int | None = None,
) -> Placement:
    """Compare-and-set (by default on the state and generation ``placement`` was read in), then the
    history row; ``conflict`` when another writer moved the row first."""
    expected_state = expected_state or placement.state
    expected_generation = placement.generation if expected_generation is None else expected_generation
    if not _write(placement, expected_state=expected_state, expected_generation=expected_generation, changes=changes):
        raise Conflict(conflict)
    _apply(placement, changes)
    _history(session, placement, from_state=expected_state, actor=actor, reason=reason, at_ms=at)
    return placement


def placement_ensure_local(*, session: Session, actor: Actor = SYSTEM) -> Placement:
    """The session's placement, created ``local`` at generation 0 when it has none."""
    existing = _read(session)
    if existing is not None:
        return existing
    at = now_ms()
    try:
        with transaction.atomic():
            placement = Placement.objects.create(
                session=session,
                agent_id=session.agent_id,
                session_key=session.key,
                state=S.LOCAL,
                generation=0,
                created_at_ms=at,
                updated_at_ms=at,
                state_changed_at_ms=at,
            )
            _history(session, placement, from_state="", actor=actor, reason="created", at_ms=at)
            return placement
    except IntegrityError:
        return Placement.objects.get(pk=session.pk)  # created concurrently


def placement_start_dispatch(
    *,
    session: Session,
    execution_mode: str = ExecutionMode.WORKER_TURN,
    target: str | None = None,
    owner: str | None = None,
    actor: Actor = SYSTEM,
    reason: str = "",
) -> Placement:
    """local/reclaimed/failed → requested: the dispatch barrier. Worker facts are cleared; a local
    turn claim in flight is kept (it finishes before the worker takes over)."""
    placement_ensure_local(session=session, actor=actor)
    with transaction.atomic():
        placement = Placement.objects.get(pk=session.pk)
        if placement.state not in (S.LOCAL, S.RECLAIMED, S.FAILED):
            raise InvalidRequest(f"Cannot dispatch session {_label(session)} from placement {placement.state}")
        at = now_ms()
        changes = _moved(
            placement,
            S.REQUESTED,
            at,
            **dict.fromkeys(WORKER_FIELDS),
            recovery_error=None,
            terminal_reason=None,
            terminal_at_ms=None,
            execution_mode=execution_mode,
            dispatch_target=target,
            dispatch_owner=owner,
        )
        changes.update(_worker_claim_released(placement))
        _commit(
            session,
            placement,
            changes=changes,
            conflict=f"Session {_label(session)} placement changed during dispatch barrier",
            actor=actor,
            reason=reason or "dispatch requested",
            at=at,
        )
    return placement


def placement_transition(
    *,
    session: Session,
    from_state: str,
    to_state: str,
    expected_generation: int,
    patch: dict[str, Any] | None = None,
    actor: Actor = SYSTEM,
    reason: str = "",
) -> Placement:
    """One legal edge of workers.md §1.3 (not into ``failed``, not draining → reconciling)."""
    patch = dict(patch or {})
    unknown = set(patch) - set(PATCHABLE)
    if unknown:
        raise InvalidRequest(f"Unknown worker session placement fields: {', '.join(sorted(unknown))}")
    if to_state not in TRANSITIONS.get(from_state, ()):
        raise InvalidRequest(f"Illegal worker session placement transition: {from_state} -> {to_state}")
    if (from_state, to_state) == (S.DRAINING, S.RECONCILING):
        raise InvalidRequest("Use startReconcile after fencing the drained worker environment")
    if to_state == S.FAILED:
        raise InvalidRequest("Use fail to record terminal worker placement diagnostics")
    with transaction.atomic():
        placement = _read(session)
        _expect(session, placement, from_state, expected_generation)
        if placement.turn_claim_owner is not None:
            raise InvalidRequest(f"Cannot transition session {_label(session)} during an active turn")
        at = now_ms()
        changes: dict[str, Any] = {name: value for name, value in patch.items() if value is not None}
        if to_state in (S.LOCAL, S.REQUESTED):
            changes.update(dict.fromkeys(WORKER_FIELDS))
        if to_state in (S.PROVISIONING, S.SYNCING, S.STARTING):
            changes["active_owner_epoch"] = None
        changes["recovery_error"] = None
        changes["terminal_reason"] = None
        changes["terminal_at_ms"] = (placement.terminal_at_ms or at) if to_state == S.RECLAIMED else None
        changes.update(dict.fromkeys(CLAIM_FIELDS))
        changes.update(_moved(placement, to_state, at))
        try:
            with transaction.atomic():
                written = _write(
                    placement, expected_state=from_state, expected_generation=expected_generation, changes=changes
                )
        except IntegrityError:
            raise InvalidRequest(
                f"Worker session placement {_label(session)} cannot be {to_state} without its worker facts"
            ) from None
        if not written:
            raise Conflict(f"Worker session placement {_label(session)} changed during transition")
        _apply(placement, changes)
        if to_state == S.ACTIVE:
            _mark_environment_activated(session, placement, at)
        _history(session, placement, from_state=from_state, actor=actor, reason=reason, at_ms=at)
    return placement


def _expect(session: Session, placement: Placement | None, state: str, generation: int) -> None:
    found = f"{placement.state}@{placement.generation}" if placement is not None else "missing"
    if placement is None or placement.state != state or placement.generation != generation:
        raise Conflict(
            f"Worker session placement {_label(session)} changed: expected {state}@{generation}, found {found}",
            details={"code": "PLACEMENT_CHANGED"},
        )


def _mark_environment_activated(session: Session, placement: Placement, at: int) -> None:
    """The active owner must be the environment's one attached session with the same epoch."""
    updated = WorkerEnvironment.objects.filter(
        environment_id=placement.environment_id,
        state=EnvironmentState.ATTACHED,
        destroy_requested_at_ms__isnull=True,
        owner_epoch=placement.active_owner_epoch,
        attached_session_ids=[session.session_id],
    ).update(last_activated_at_ms=at, updated_at_ms=at)
    if not updated:
        # Raised inside the transaction: the placement's own change is undone with it.
        raise Conflict(f"Worker session placement {_label(session)} lost its attached environment")


def placement_fail(
    *,
    session: Session,
    recovery_error: str,
    expected_generation: int | None = None,
    actor: Actor = SYSTEM,
) -> Placement:
    """Record a terminal failure. The first ``terminal_reason``/``terminal_at_ms`` win: failing an
    already failed placement changes only its ``recovery_error`` (and keeps its generation)."""
    reason = bounded_worker_error(recovery_error)
    if not reason:
        raise InvalidRequest("A worker placement failure needs a reason")
    with transaction.atomic():
        placement = _read(session)
        if placement is None:
            raise InvalidRequest(f"Session {_label(session)} has no worker placement")
        if expected_generation is not None and placement.generation != expected_generation:
            raise Conflict(f"Worker session placement {_label(session)} changed before failure")
        at = now_ms()
        if placement.state == S.FAILED:
            changes: dict[str, Any] = {"recovery_error": reason, "updated_at_ms": at}
            if not _write(
                placement, expected_state=S.FAILED, expected_generation=placement.generation, changes=changes
            ):
                raise Conflict(f"Worker session placement {_label(session)} changed before failure")
            _apply(placement, changes)
            _history(session, placement, from_state=S.FAILED, actor=actor, reason=reason, at_ms=at)
            return placement
        if S.FAILED not in TRANSITIONS[placement.state]:
            raise InvalidRequest(f"Cannot fail worker session placement from {placement.state}")
        changes = _moved(placement, S.FAILED, at, recovery_error=reason, terminal_reason=reason, terminal_at_ms=at)
        changes.update(_worker_claim_released(placement))
        _commit(
            session,
            placement,
            changes=changes,
            conflict=f"Worker session placement {_label(session)} changed before failure",
            actor=actor,
            reason=reason,
            at=at,
        )
    return placement


OWNED_PATHS = {
    S.ACTIVE: (S.DRAINING, S.RECONCILING, S.FAILED),
    S.DRAINING: (S.RECONCILING, S.FAILED),
    S.RECONCILING: (S.FAILED,),
}


def placement_fail_owned(
    *,
    session: Session,
    environment_id: str,
    owner_epoch: int,
    expected_generation: int,
    recovery_error: str,
    actor: Actor = SYSTEM,
) -> Placement:
    """Fail a placement its worker still owns: active → draining → reconciling → failed (whichever steps
    remain) in one transaction and one compare-and-set, as OpenClaw's ``failWorkspaceResultAndReleaseTurn``.

    Each step keeps its own generation and history row, so the record reads as if it walked the
    edges; no reader sees it half-way, and a crash cannot leave it draining. Every turn claim closes.
    """
    reason = bounded_worker_error(recovery_error)
    if not reason:
        raise InvalidRequest("A worker placement failure needs a reason")
    with transaction.atomic():
        placement = _read(session)
        path = OWNED_PATHS.get(placement.state, ()) if placement is not None else ()
        if not path or not _owned_by(placement, environment_id, owner_epoch, expected_generation, placement.state):
            raise Conflict(f"Cannot reconcile stale worker placement for session {_label(session)}")
        if placement.generation + len(path) > MAX_GENERATION:
            raise InvalidRequest("Worker session placement generation is exhausted")
        at = now_ms()
        from_state, generation = placement.state, placement.generation
        changes = {
            **dict.fromkeys(CLAIM_FIELDS),
            "state": S.FAILED,
            "generation": generation + len(path),
            "recovery_error": reason,
            "terminal_reason": reason,
            "terminal_at_ms": at,
            "updated_at_ms": at,
            "state_changed_at_ms": at,
        }
        if not _write(placement, expected_state=from_state, expected_generation=generation, changes=changes):
            raise Conflict(f"Cannot reconcile stale worker placement for session {_label(session)}")
        _apply(placement, changes)
        PlacementHistory.objects.bulk_create(
            PlacementHistory(
                session_id=placement.pk,
                session_key=placement.session_key,
                from_state=before,
                to_state=after,
                generation=generation + step,
                environment_id=environment_id,
                actor=actor.label,
                reason=reason,
                at_ms=at,
            )
            for step, (before, after) in enumerate(zip((from_state, *path), path, strict=False), start=1)
        )
        placement_changed_on_commit(session, placement)
    return placement


def _owned_by(placement: Placement | None, environment_id: str, owner_epoch: int, generation: int, state: str) -> bool:
    return (
        placement is not None
        and placement.state == state
        and placement.environment_id == environment_id
        and placement.active_owner_epoch == owner_epoch
        and placement.generation == generation
    )


def placement_start_drain(
    *,
    session: Session,
    environment_id: str,
    owner_epoch: int,
    expected_generation: int,
    workspace_base_manifest_ref: str | None = None,
    actor: Actor = SYSTEM,
    reason: str = "",
) -> Placement:
    """active → draining, only for the exact owner; an admitted worker turn keeps its claim."""
    with transaction.atomic():
        placement = _read(session)
        if not _owned_by(placement, environment_id, owner_epoch, expected_generation, S.ACTIVE):
            raise Conflict(f"Cannot drain stale worker placement for session {_label(session)}")
        at = now_ms()
        changes = _moved(placement, S.DRAINING, at)
        if workspace_base_manifest_ref:
            changes["workspace_base_manifest_ref"] = workspace_base_manifest_ref
        _commit(
            session,
            placement,
            expected_state=S.ACTIVE,
            expected_generation=expected_generation,
            changes=changes,
            conflict=f"Cannot drain stale worker placement for session {_label(session)}",
            actor=actor,
            reason=reason,
            at=at,
        )
    return placement


def placement_start_reconcile(
    *,
    session: Session,
    environment_id: str,
    owner_epoch: int,
    expected_generation: int,
    force_local_claim: bool = False,
    actor: Actor = SYSTEM,
    reason: str = "",
) -> Placement:
    """draining → reconciling, for the exact owner; the turn claim is closed in the same write."""
    with transaction.atomic():
        placement = _read(session)
        if not _owned_by(placement, environment_id, owner_epoch, expected_generation, S.DRAINING):
            raise Conflict(f"Cannot reconcile stale worker placement for session {_label(session)}")
        if placement.turn_claim_owner == TurnClaimOwner.LOCAL and not force_local_claim:
            raise InvalidRequest(f"Cannot reconcile session {_label(session)} during an active local turn")
        at = now_ms()
        _commit(
            session,
            placement,
            expected_state=S.DRAINING,
            expected_generation=expected_generation,
            changes=_moved(placement, S.RECONCILING, at, **dict.fromkeys(CLAIM_FIELDS)),
            conflict=f"Cannot reconcile stale worker placement for session {_label(session)}",
            actor=actor,
            reason=reason,
            at=at,
        )
    return placement


def placement_retire(
    *, session: Session, expected_state: str, expected_generation: int, actor: Actor = SYSTEM, reason: str = ""
) -> None:
    """Delete a placement that holds no worker (local, requested, reclaimed or failed)."""
    if expected_state not in (S.LOCAL, S.REQUESTED, S.RECLAIMED, S.FAILED):
        raise InvalidRequest(f"Cannot retire worker session placement in {expected_state}")
    with transaction.atomic():
        placement = _read(session)
        deleted, _ = Placement.objects.filter(
            pk=session.pk, state=expected_state, generation=expected_generation
        ).delete()
        if not deleted or placement is None:
            raise Conflict(f"Worker session placement {_label(session)} changed before retirement")
        PlacementHistory.objects.create(
            session_id=session.pk,
            session_key=placement.session_key,
            from_state=expected_state,
            to_state="retired",
            generation=expected_generation,
            environment_id=placement.environment_id or "",
            actor=actor.label,
            reason=reason or "retired",
            at_ms=now_ms(),
        )


# --- turn claims ------------------------------------------------------------------------------------


def placement_claim_turn(
    *,
    session: Session,
    owner: str,
    claim_id: str,
    run_id: str,
    expected_generation: int,
    owner_epoch: int | None = None,
) -> Placement:
    """Admit one turn: the claim is taken only if nobody holds one and the placement did not move.

    The database's claim-shape rule decides where each kind of claim may run (a local claim where
    local work may run, a worker claim only by the active owner's epoch).
    """
    changes: dict[str, Any] = {
        "turn_claim_owner": owner,
        "turn_claim_id": claim_id,
        "turn_claim_run_id": run_id,
        "turn_claim_generation": expected_generation,
        "turn_claim_owner_epoch": owner_epoch if owner == TurnClaimOwner.WORKER else None,
        "updated_at_ms": now_ms(),
    }
    with transaction.atomic():
        placement = _read(session)
        if placement is None:
            raise InvalidRequest(f"Session {_label(session)} has no worker placement")
        if placement.generation != expected_generation:
            raise Conflict(f"Worker session placement {_label(session)} changed before the turn claim")
        try:
            with transaction.atomic():
                claimed = Placement.objects.filter(
                    pk=session.pk, generation=expected_generation, turn_claim_owner__isnull=True
                ).update(**changes)
        except IntegrityError:
            if owner == TurnClaimOwner.WORKER:
                raise InvalidRequest("Worker turn claim requires the active or draining worker owner epoch") from None
            raise InvalidRequest("Local turn claim requires local, dispatch-barrier, or failed placement") from None
        if not claimed:
            raise Conflict(f"Session {_label(session)} already has an active turn")
        return _apply(placement, changes)


def placement_release_turn(*, session: Session, claim_id: str) -> bool:
    """Release a turn claim by its id; False when it was already released (or taken over)."""
    return bool(
        Placement.objects.filter(pk=session.pk, turn_claim_id=claim_id).update(
            **dict.fromkeys(CLAIM_FIELDS), updated_at_ms=now_ms()
        )
    )


def placement_advance_cursors(
    *, session: Session, transcript: int | None = None, live_event: int | None = None
) -> None:
    """Acknowledged cursors only move forward (a late, smaller acknowledgement changes nothing)."""
    if transcript is not None:
        Placement.objects.filter(pk=session.pk, state__in=(S.ACTIVE, S.DRAINING, S.RECONCILING)).filter(
            _below("last_transcript_ack_cursor", transcript)
        ).update(last_transcript_ack_cursor=transcript, updated_at_ms=now_ms())
    if live_event is not None:
        Placement.objects.filter(pk=session.pk, state__in=(S.ACTIVE, S.DRAINING, S.RECONCILING)).filter(
            _below("last_live_event_ack_cursor", live_event)
        ).update(last_live_event_ack_cursor=live_event, updated_at_ms=now_ms())


def _below(field: str, value: int) -> Q:
    return Q(**{f"{field}__isnull": True}) | Q(**{f"{field}__lt": value})


__all__ = [
    "FORCED_WORKER_ABANDONMENT_ERROR",
    "Actor",
    "bounded_worker_error",
    "placement_advance_cursors",
    "placement_claim_turn",
    "placement_ensure_local",
    "placement_fail",
    "placement_fail_owned",
    "placement_release_turn",
    "placement_retire",
    "placement_start_dispatch",
    "placement_start_drain",
    "placement_start_reconcile",
    "placement_transition",
]
