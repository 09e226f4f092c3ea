"""``sessions.move`` (workers.md §4.2): the intent is persisted before anything moves, so a gateway that
dies mid-move leaves a record that recovery finishes; an identical request joins it.

Back to the gateway the path is active → draining → reconciling → local (never through
``reclaimed``): admission closes, the worker's turn claim is fenced, the source environment is torn
down (after the worker's workspace changes were applied to the session's worktree), and the
session runs locally again.

One call drives a move at a time (``PlacementMove.driver``): the one that recorded the intent, or one that
claimed it back — the same move retried after its source teardown failed, or recovery once its driver is
gone. An identical request made while it is driven joins it: it changes nothing, and its caller waits for
the driver's outcome (``operations.move_result``) without a thread or a database connection.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction

from gateway import selectors as gateway_selectors
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
logger = logging.getLogger(__name__)
# The moves this process drives now: a claim of this process missing here was left by a driver that ended
# without giving it back (its last write failed), and may be claimed at once.
_driving: set[str] = set()


@dataclass(frozen=True)
class MoveStart:
    """What :func:`move_session` did: drove the move (``placement`` as it left it), or joined the move that the
    call ``joined`` drives (``placement`` as this call found it; the outcome is that driver's)."""

    placement: Placement
    joined: str | None = None


def move_pending(session: Session) -> bool:
    return PlacementMove.objects.filter(session=session).exists()


def _stale(session: Session) -> Conflict:
    return Conflict(f"Cannot move stale worker placement for session {session.session_id}")


@contextlib.contextmanager
def _driver() -> Iterator[str]:
    """This call's driver token for the duration of the block; whatever happens, its claim is given back at the
    end (a move it did not finish may then be resumed at once)."""
    token = f"{executor_label()}/{secrets.token_hex(6)}"
    _driving.add(token)
    try:
        yield token
    finally:
        _driving.discard(token)
        try:
            PlacementMove.objects.filter(driver=token).update(driver="")
        except DatabaseError:
            logger.warning("could not release the move claim %s; it is claimable as abandoned", token)


def _abandoned(intent: PlacementMove) -> bool:
    """Whether the driver of ``intent`` is gone without giving it back: a call of this process that has ended,
    a gateway process that is no longer live, or a driver silent past the stage deadline."""
    process = intent.driver.rpartition("/")[0]
    if process == executor_label():
        return intent.driver not in _driving
    if now_ms() - intent.updated_at_ms > settings.OPENCLAW_WORKERS["STAGE_DEADLINE_MS"]:
        return True
    boot_id = process.removeprefix("gateway:")
    return boot_id != process and boot_id not in gateway_selectors.live_process_boot_ids()


def _claimable(intent: PlacementMove) -> bool:
    return not intent.driver or _abandoned(intent)


def _claim(intent: PlacementMove, token: str) -> str:
    """Make ``token`` the driver of ``intent`` unless a live call drives it (compare-and-set on the driver it was
    read with); returns the move's driver afterwards ("" once the move is over)."""
    if not _claimable(intent):
        return intent.driver
    if PlacementMove.objects.filter(pk=intent.pk, driver=intent.driver).update(driver=token, updated_at_ms=now_ms()):
        intent.driver = token
        return token
    return PlacementMove.objects.filter(pk=intent.pk).values_list("driver", flat=True).first() or ""


def _intent(
    session: Session, placement: Placement, *, target_kind: str, target_id: str, abandon_source: bool, token: str
) -> tuple[PlacementMove, str]:
    """The persisted intent and its driver: recorded once (``token`` drives it), claimed back when nobody
    drives it; the same request made while another call drives it joins that one, another is refused."""
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
    left_behind = existing is not None and existing.source_environment_id != wanted["source_environment_id"]
    if left_behind and _claimable(existing):
        # Left by a move whose placement another operation (a reclaim) took on before it finished: the placement
        # has another environment since, and nothing would ever finish or remove that move.
        PlacementMove.objects.filter(pk=existing.pk, driver=existing.driver).delete()
        existing = None
    if existing is None:
        try:
            with transaction.atomic():
                # Locked so that the intent is recorded against the placement this call checked: a move that
                # finished in between changed it, and this request is stale.
                checked = Placement.objects.select_for_update(no_key=True).filter(
                    pk=session.pk, state=placement.state, generation=placement.generation
                )
                if checked.first() is None:
                    raise _stale(session)
                intent = PlacementMove.objects.create(
                    operation_id=f"move:v1:{secrets.token_hex(16)}",
                    session=session,
                    driver=token,
                    created_at_ms=at,
                    updated_at_ms=at,
                    **wanted,
                )
                return intent, token
        except IntegrityError:
            existing = PlacementMove.objects.filter(session=session).first()
            if existing is None:
                raise _stale(session) from None
    if any(getattr(existing, name) != value for name, value in wanted.items() if name != "source_generation"):
        raise Conflict(f"Session {session.session_id} already has a conflicting placement move")
    return existing, _claim(existing, token)


def move_session(
    *,
    session: Session,
    expected_generation: int,
    expected_environment_id: str,
    expected_owner_epoch: int,
    target: str = "gateway",
    abandon_source: bool = False,
    actor: Actor,
) -> MoveStart:
    """Move an active session off its worker (or rejoin the move already under way): back to this gateway,
    or on to another target (``profile:<id>`` / ``device:<id>``, checked by the caller), which is the
    gateway move followed by a dispatch to the target started in the same transaction that closes the
    move. The placement it leaves: ``local`` for the gateway, the new dispatch's first stage otherwise."""
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
        raise _stale(session)
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
    with _driver() as token:
        intent, driver = _intent(
            session, placement, target_kind=target_kind, target_id=target_id, abandon_source=abandon_source, token=token
        )
        if driver != token:
            return MoveStart(placement, joined=driver)
        return MoveStart(_finish_move(session, intent, token, actor=actor))


def _heartbeat(intent: PlacementMove, token: str) -> None:
    """The driver is alive (between its steps, each bounded by its own deadline)."""
    PlacementMove.objects.filter(pk=intent.pk, driver=token).update(updated_at_ms=now_ms())


def _finish_move(session: Session, intent: PlacementMove, token: str, *, actor: Actor) -> Placement:
    """Drive the persisted move from wherever it stands (``token`` holds its claim); every step is a
    compare-and-set, so a writer that races it (a reclaim, say) wins or loses cleanly."""
    placement = Placement.objects.get(pk=session.pk)
    reason = f"moving to {_target_words(intent)}"
    if placement.state in (S.ACTIVE, S.DRAINING):
        # This driver now owns the move (recovery finishes it only if the driver dies).
        Placement.objects.filter(pk=session.pk, generation=placement.generation).update(dispatch_owner=executor_label())
        placement = fence(session, placement, actor=actor, reason=reason)
        _heartbeat(intent, token)
    # The worker's changes come home before its environment goes (unless the source is abandoned).
    problem = None if intent.abandon_source else _reconcile_source_workspace(session, placement, intent)
    _heartbeat(intent, token)
    errors = [problem] if problem else teardown_environment(intent.source_environment_id, terminal_state="destroyed")
    if errors and not intent.abandon_source:
        error = composed_error(f"Worker move to {_target_words(intent)} failed; retry the move", errors)
        with transaction.atomic():
            if placement.state == S.RECONCILING:
                placement = store.placement_fail(
                    session=session, recovery_error=error, expected_generation=placement.generation, actor=actor
                )
            # Nobody drives it now: the same move, retried, resumes it; a request that joined it is told why.
            PlacementMove.objects.filter(pk=intent.pk, driver=token).update(
                last_error=error, driver="", updated_at_ms=now_ms()
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


def move_recover(session: Session, *, actor: Actor) -> Placement | None:
    """Recovery of a move whose driver died: a move to the gateway is finished (the gateway is always there);
    a move elsewhere releases its source and fails with a retry message (the destination is not
    provisioned by recovery, as in OpenClaw). None when a live call still drives it (or it is over)."""
    intent = PlacementMove.objects.filter(session=session).first()
    if intent is None:
        return None
    with _driver() as token:
        if _claim(intent, token) != token:
            return None
        if intent.target_kind != MoveTargetKind.GATEWAY:
            placement = Placement.objects.get(pk=session.pk)
            PlacementMove.objects.filter(pk=intent.pk).delete()
            return fail_in_flight(
                session, placement, f"Worker move to {intent.target_kind} was interrupted; retry the move", actor=actor
            )
        return _finish_move(session, intent, token, actor=actor)
