"""Placement operations as the RPC, the JSON API and the console start them: the service call and the
task that carries a dispatch on once its transaction commits. Who may ask (scopes, staff) is each
caller's check; what may happen is the services'."""

from __future__ import annotations

from openclaw_site.gateway.background import dispatch_on_commit
from openclaw_site.gateway.exceptions import InvalidRequest, Unavailable
from sessions_app.models import Session

from .models import Placement, PlacementState
from .services import dispatch, moves
from .services.placements import Actor
from .tasks import dispatch_advance

S = PlacementState


def start_dispatch(*, session: Session, profile_id: str | None, device_id: str | None, actor: Actor) -> Placement:
    """``sessions.dispatch``: the placement leaves ``local``; its stages run in a task from here on."""
    target = dispatch.resolve_target(profile_id=profile_id, device_id=device_id)
    placement, started = dispatch.dispatch_start(session=session, target=target, actor=actor)
    if started:
        dispatch_on_commit(dispatch_advance, session.pk, placement.generation)
    return placement


def start_move(
    *,
    session: Session,
    target: str,
    expected_generation: int,
    expected_environment_id: str,
    expected_owner_epoch: int,
    abandon_source: bool,
    actor: Actor,
) -> Placement:
    """``sessions.move``: back to the gateway (``target="gateway"``) or on to a resolved worker target."""
    if session.archived_at is not None:
        raise InvalidRequest("cannot move an archived session")
    if target != "gateway":
        dispatch.ensure_placeable(session)  # before anything moves
    placement = moves.move_session(
        session=session,
        expected_generation=expected_generation,
        expected_environment_id=expected_environment_id,
        expected_owner_epoch=expected_owner_epoch,
        target=target,
        abandon_source=abandon_source,
        actor=actor,
    )
    if target != "gateway" and placement.state == S.PROVISIONING:
        dispatch_on_commit(dispatch_advance, session.pk, placement.generation)
    elif placement.state != S.LOCAL:
        # The source could not be torn down: the move is kept (with its error) for the same move to resume.
        raise Unavailable(
            placement.recovery_error or f"session move stopped in {placement.state}",
            details={"code": "WORKER_MOVE_FAILED"},
            retryable=True,
        )
    return placement
