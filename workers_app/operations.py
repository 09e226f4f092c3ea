"""Placement operations as the RPC, the JSON API and the console start them: the service call and the
task that carries a dispatch on once its transaction commits, and the wait for a dispatch to settle.
Who may ask (scopes, staff) is each caller's check, passed in as ``is_admin``; what may happen is the
services'."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from channels.db import DatabaseSyncToAsync, database_sync_to_async
from django.conf import settings

from gateway.background import dispatch_on_commit
from gateway.exceptions import InvalidRequest, NotFound, PermissionDenied, Unavailable
from sessions_app import keys
from sessions_app import selectors as session_selectors
from sessions_app.models import Session

from . import selectors
from .models import Placement, PlacementState
from .schemas import DispatchTarget, MoveRequest, ReclaimOptions
from .services import dispatch, moves, reclaim
from .services.placements import Actor
from .tasks import dispatch_advance

S = PlacementState
SETTLED = (S.ACTIVE, S.FAILED, S.LOCAL, S.RECLAIMED)
PROFILE_REFUSED = "Your operator role cannot dispatch to this Cloud profile."
AUTO_DEVICE_FAILED = (
    "automatic device placement failed after 0 attempts; no eligible host remains; "
    "reconnect a paired session-host node and retry"
)


def provider_bound[T](fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """Work that may wait on a worker provider (a teardown, up to its deadline) runs in a pool thread:
    it must not hold the one thread every other request's database work goes through."""
    return DatabaseSyncToAsync(fn, thread_sensitive=False)


def session_for(key: str, agent_id: str | None) -> Session:
    """The session a placement operation names (a bare key under ``agent_id``), or NotFound."""
    session = session_selectors.session_get(keys.canonical_key(key, agent_id))
    if session is None:
        raise NotFound(f"session not found: {key}")
    return session


# --- sessions.dispatch ----------------------------------------------------------------------------


def dispatch_target_check(target: DispatchTarget) -> None:
    """The refusal that comes before the session is looked up (OpenClaw answers it first)."""
    if target.autoDevice and (target.profileId is not None or target.deviceId is not None):
        raise InvalidRequest("choose exactly one dispatch target: autoDevice, deviceId, or profileId")


def dispatch_requested(*, session: Session, target: DispatchTarget, is_admin: bool, actor: Actor) -> Placement:
    """``sessions.dispatch`` as a caller asks for it: a Cloud profile (or no target) needs an admin."""
    if target.autoDevice:
        raise InvalidRequest(AUTO_DEVICE_FAILED)
    if not is_admin and (target.profileId is not None or target.deviceId is None):
        raise PermissionDenied(PROFILE_REFUSED, code="FORBIDDEN")
    return start_dispatch(session=session, profile_id=target.profileId, device_id=target.deviceId, actor=actor)


def start_dispatch(*, session: Session, profile_id: str | None, device_id: str | None, actor: Actor) -> Placement:
    """``sessions.dispatch``: the placement leaves ``local``; its stages run in a task from here on."""
    dispatch.ensure_not_archived(session)
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
) -> moves.MoveStart:
    """``sessions.move``: back to the gateway (``target="gateway"``) or on to a resolved worker target. A call
    that joined the move another call drives returns at once (:func:`move_result` waits for its outcome)."""
    if session.archived_at is not None:
        raise InvalidRequest("cannot move an archived session")
    if target != "gateway":
        dispatch.ensure_placeable(session)  # before anything moves
    started = moves.move_session(
        session=session,
        expected_generation=expected_generation,
        expected_environment_id=expected_environment_id,
        expected_owner_epoch=expected_owner_epoch,
        target=target,
        abandon_source=abandon_source,
        actor=actor,
    )
    placement = started.placement
    if started.joined is not None:
        return started
    if target != "gateway" and placement.state == S.PROVISIONING:
        dispatch_on_commit(dispatch_advance, session.pk, placement.generation)
    elif placement.state != S.LOCAL:
        raise _move_failed(placement.recovery_error, placement.state)
    return started


def _move_failed(error: str | None, state: str) -> Unavailable:
    """The source could not be torn down: the move is kept (with its error) for the same move to resume."""
    return Unavailable(
        error or f"session move stopped in {state}; retry the move",
        details={"code": "WORKER_MOVE_FAILED"},
        retryable=True,
    )


# --- sessions.move --------------------------------------------------------------------------------


def move_target(request: MoveRequest, *, is_admin: bool) -> str:
    target = request.target
    if target.kind == "gateway":
        return "gateway"
    if target.kind == "profile":
        if not is_admin:
            raise PermissionDenied(PROFILE_REFUSED, code="FORBIDDEN")
        return dispatch.resolve_target(profile_id=target.profileId, device_id=None)
    return dispatch.resolve_target(profile_id=None, device_id=target.deviceId)


def move_requested(*, session: Session, request: MoveRequest, is_admin: bool, actor: Actor) -> tuple[str, str | None]:
    """``sessions.move`` as a caller asks for it; returns the resolved target (``"gateway"`` or a worker
    target) and the driver of the move this call joined (None: this call drove it), for :func:`move_result`."""
    if session.archived_at is not None:
        raise InvalidRequest("cannot move an archived session")
    target = move_target(request, is_admin=is_admin)
    started = start_move(
        session=session,
        target=target,
        expected_generation=request.expected.generation,
        expected_environment_id=request.expected.environmentId,
        expected_owner_epoch=request.expected.ownerEpoch,
        abandon_source=bool(request.abandonSource),
        actor=actor,
    )
    return target, started.joined


async def move_result(session_pk: int, target: str, joined: str | None) -> dict:
    """What ``sessions.move`` answers: back to the gateway, the placement at once; on to a profile or device, once
    the destination's dispatch settled (like ``sessions.dispatch``). A call that joined a move another call
    drives first waits for that driver's outcome, and answers it as the driver's caller is answered."""
    if joined is not None:
        await _move_finished(session_pk)
    if target != "gateway":
        return await settled_result(session_pk, failure_code="WORKER_DISPATCH_FAILED")
    session = await database_sync_to_async(Session.objects.get)(pk=session_pk)
    return await database_sync_to_async(selectors.placement_result)(session)


async def _move_finished(session_pk: int) -> None:
    """Until the move is over (its intent goes with its last step) or ``OPENCLAW_WORKER_DISPATCH_WAIT_MS`` ran
    out; UNAVAILABLE with the driver's reason when its attempt failed (nobody drives it then: the same move,
    retried, resumes it). Polls, holding no thread and no connection in between."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.OPENCLAW_WORKERS["DISPATCH_WAIT_MS"] / 1000
    pause = 0.02
    while True:
        progress = await database_sync_to_async(selectors.move_progress)(session_pk)
        if progress is None:
            return
        driver, error, state = progress
        if not driver:
            raise _move_failed(error, state)
        if loop.time() >= deadline:
            return
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.5)


# --- sessions.reclaim -----------------------------------------------------------------------------


def reclaim_requested(*, session: Session, options: ReclaimOptions, actor: Actor) -> Placement:
    generation = options.recoverToGateway.expectedGeneration if options.recoverToGateway else None
    return reclaim.reclaim(session=session, recover_to_gateway_generation=generation, actor=actor)


# --- waiting for a dispatch -----------------------------------------------------------------------


async def settled_result(session_pk: int, *, failure_code: str) -> dict:
    """The placement once its dispatch settled (UNAVAILABLE with its reason if it failed), or as it stands
    when ``OPENCLAW_WORKER_DISPATCH_WAIT_MS`` ran out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.OPENCLAW_WORKERS["DISPATCH_WAIT_MS"] / 1000
    pause = 0.02
    while True:
        session, state, error = await database_sync_to_async(_settled)(session_pk)
        if state == S.FAILED:
            raise Unavailable(error, details={"code": failure_code})
        if state in SETTLED or loop.time() >= deadline:
            return await database_sync_to_async(selectors.placement_result)(session)
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.5)


def _settled(session_pk: int) -> tuple[Session, str, str]:
    session = Session.objects.get(pk=session_pk)
    placement = selectors.placement_for(session)
    if placement is None:
        return session, S.LOCAL, ""
    return session, placement.state, placement.recovery_error or ""
