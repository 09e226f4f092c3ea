"""``sessions.move`` (workers.md §4.2): the intent is persisted before anything moves, so a gateway that
dies mid-move leaves a record that recovery finishes; an identical request joins it.

Back to the gateway the path is active → draining → reconciling → local (never through
``reclaimed``): admission closes, the worker's turn claim is fenced, the source environment is torn
down (after the worker's workspace changes were applied to the session's worktree), and the
session runs locally again.
"""

from __future__ import annotations

import secrets

from django.db import IntegrityError, transaction

from gateway.background import executor_label
from gateway.exceptions import Conflict, InvalidRequest
from sessions_app.models import Session

from ..models import (
    TERMINAL_ENVIRONMENT_STATES,
    EnvironmentState,
    MoveTargetKind,
    Placement,
    PlacementMove,
    PlacementState,
    WorkerEnvironment,
)
from ..providers import WorkerProviderError
from ..runtimes import worker_runtimes
from . import placements as store
from .dispatch import dispatch_start
from .placements import FORCED_WORKER_ABANDONMENT_ERROR, Actor, now_ms
from .teardown import composed_error, fail_in_flight, fence, teardown_environment

S = PlacementState


def move_pending(session: Session) -> bool:
    return PlacementMove.objects.filter(session=session).exists()


def _intent(
    session: Session, placement: Placement, *, target_kind: str, target_id: str, abandon_source: bool
) -> PlacementMove:
    """The persisted intent: created once; the same request finds it again, another is refused."""
    at = now_ms()
    wanted = {
        "source_generation": placement.generation,
        "source_environment_id": placement.environment_id or "",
        "source_owner_epoch": placement.active_owner_epoch or 0,
        "target_kind": target_kind,
        "target_id": target_id,
        "abandon_source": abandon_source,
    }
    existing = PlacementMove.objects.filter(session=session).first()
    if existing is None:
        try:
            with transaction.atomic():
                return PlacementMove.objects.create(
                    operation_id=f"move:v1:{secrets.token_hex(16)}",
                    session=session,
                    created_at_ms=at,
                    updated_at_ms=at,
                    **wanted,
                )
        except IntegrityError:
            existing = PlacementMove.objects.get(session=session)
    if any(getattr(existing, name) != value for name, value in wanted.items() if name != "source_generation"):
        raise Conflict(f"Session {session.session_id} already has a conflicting placement move")
    return existing


def move_session(
    *,
    session: Session,
    expected_generation: int,
    expected_environment_id: str,
    expected_owner_epoch: int,
    target: str = "gateway",
    abandon_source: bool = False,
    actor: Actor,
) -> Placement:
    """Move an active session off its worker (or rejoin the move already under way): back to this gateway,
    or on to another target (``profile:<id>`` / ``device:<id>``, checked by the caller), which is the
    gateway move followed by a dispatch to the target started in the same transaction that closes the
    move. Returns the placement: ``local`` for the gateway, the new dispatch's first stage otherwise."""
    placement = Placement.objects.filter(pk=session.pk).first()
    state = placement.state if placement is not None else "local"
    force_abandoned = (
        placement is not None
        and placement.state == S.FAILED
        and placement.recovery_error == FORCED_WORKER_ABANDONMENT_ERROR
        and abandon_source
    )
    # A move whose source teardown failed left the placement failed with its intent: the same move resumes it.
    failed_move = placement is not None and placement.state == S.FAILED and move_pending(session)
    if state not in (S.ACTIVE, S.DRAINING, S.RECONCILING) and not force_abandoned and not failed_move:
        raise InvalidRequest(f"session cannot move from placement {state}")
    exact = placement.environment_id == expected_environment_id and placement.active_owner_epoch == expected_owner_epoch
    if not exact or (state == S.ACTIVE and placement.generation != expected_generation):
        raise Conflict(f"Cannot move stale worker placement for session {session.session_id}")
    if state == S.ACTIVE:
        environment = WorkerEnvironment.objects.filter(pk=expected_environment_id).first()
        if (
            environment is None
            or environment.state != EnvironmentState.ATTACHED
            or environment.owner_epoch != expected_owner_epoch
            or environment.attached_session_ids != [session.session_id]
        ):
            raise Conflict(f"Cannot move stale worker environment for session {session.session_id}")
    target_kind, _, target_id = target.partition(":")
    _intent(session, placement, target_kind=target_kind, target_id=target_id, abandon_source=abandon_source)
    return _finish_move(session, actor=actor)


def _finish_move(session: Session, *, actor: Actor) -> Placement:
    """Drive the persisted move from wherever it stands; every step is a compare-and-set, so a second
    driver (a retry, or recovery after a restart) that loses a race changes nothing."""
    placement = Placement.objects.get(pk=session.pk)
    intent = PlacementMove.objects.get(session=session)
    reason = f"moving to {_target_words(intent)}"
    if placement.state in (S.ACTIVE, S.DRAINING):
        # This driver now owns the move (recovery finishes it only if the driver dies).
        Placement.objects.filter(pk=session.pk, generation=placement.generation).update(dispatch_owner=executor_label())
        placement = fence(session, placement, actor=actor, reason=reason)
    # The worker's changes come home before its environment goes (unless the source is abandoned).
    problem = None if intent.abandon_source else _reconcile_source_workspace(session, placement, intent)
    errors = [problem] if problem else teardown_environment(intent.source_environment_id, terminal_state="destroyed")
    if errors and not intent.abandon_source:
        error = composed_error(f"Worker move to {_target_words(intent)} failed; retry the move", errors)
        PlacementMove.objects.filter(pk=intent.pk).update(last_error=error, updated_at_ms=now_ms())
        if placement.state == S.RECONCILING:
            placement = store.placement_fail(
                session=session, recovery_error=error, expected_generation=placement.generation, actor=actor
            )
        return placement
    with transaction.atomic():
        # From reconciling (the worker released) or failed (a retried move, or an abandoned source).
        placement = store.placement_transition(
            session=session,
            from_state=placement.state,
            to_state=S.LOCAL,
            expected_generation=placement.generation,
            actor=actor,
            reason="source abandoned" if placement.state == S.FAILED and intent.abandon_source else reason,
        )
        PlacementMove.objects.filter(pk=intent.pk).delete()
        if intent.target_kind != MoveTargetKind.GATEWAY:
            placement, _started = dispatch_start(
                session=session, target=f"{intent.target_kind}:{intent.target_id}", actor=actor
            )
    return placement


def _reconcile_source_workspace(session: Session, placement: Placement, intent: PlacementMove) -> str | None:
    """Apply the source worker's workspace changes to the session's worktree; the failure's reason, or None."""
    environment = WorkerEnvironment.objects.filter(pk=intent.source_environment_id).first()
    if environment is None or environment.state in TERMINAL_ENVIRONMENT_STATES or not environment.node_device_id:
        return None  # no worker of ours ever held a workspace there
    runtime = worker_runtimes.for_provider(environment.provider_id)
    if runtime is None:
        return None
    try:
        runtime.reconcile_workspace(session, placement, environment)
    except WorkerProviderError as error:
        return error.message
    return None


def _target_words(intent: PlacementMove) -> str:
    if intent.target_kind == MoveTargetKind.GATEWAY:
        return "the gateway"
    return f"{intent.target_kind} {intent.target_id}"


def move_recover(session: Session, *, actor: Actor) -> Placement:
    """Recovery of a move whose driver died: a move to the gateway is finished (the gateway is always there);
    a move elsewhere releases its source and fails with a retry message (the destination is not
    provisioned by recovery, as in OpenClaw)."""
    intent = PlacementMove.objects.get(session=session)
    if intent.target_kind != MoveTargetKind.GATEWAY:
        placement = Placement.objects.get(pk=session.pk)
        PlacementMove.objects.filter(pk=intent.pk).delete()
        return fail_in_flight(
            session, placement, f"Worker move to {intent.target_kind} was interrupted; retry the move", actor=actor
        )
    return _finish_move(session, actor=actor)
