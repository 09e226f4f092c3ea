"""``sessions.reclaim`` (workers.md §4.3, "Stop cloud worker") and ``environments.destroy``."""

from __future__ import annotations

from django.db import transaction

from gateway.audit import audit
from gateway.exceptions import InvalidRequest, NotFound, Unavailable
from sessions_app.models import Session

from ..models import TERMINAL_ENVIRONMENT_STATES, Placement, PlacementMove, PlacementState, WorkerEnvironment
from . import placements as store
from .placements import FORCED_WORKER_ABANDONMENT_ERROR, Actor
from .teardown import composed_error, fail_in_flight, reclaim_active, teardown_environment

S = PlacementState
STOPPED_BY_OPERATOR = "Cloud worker stopped by operator"
PROVISIONING_CANCELED = "Cloud worker provisioning canceled"
FAILED_BY_OPERATOR = "Worker placement failed by operator"
# What an operator may fail: a dispatch or move that stopped moving, or a worker given up (its
# environment is torn down). Failed, reclaimed and local placements have nothing left to fail.
FORCE_FAILABLE_STATES = (S.REQUESTED, S.PROVISIONING, S.SYNCING, S.STARTING, S.ACTIVE, S.DRAINING, S.RECONCILING)


def reclaim(*, session: Session, recover_to_gateway_generation: int | None = None, actor: Actor) -> Placement:
    """Stop a session's cloud worker: active → reclaimed (final reconcile, teardown); failed → local once
    its environment's teardown is done; a dispatch still requested/provisioning is canceled → local.
    Audited with the placement's state and generation before and after."""
    before = Placement.objects.filter(pk=session.pk).values_list("state", "generation").first()
    placement = _reclaim(session, recover_to_gateway_generation, actor)
    action = "placement.reclaim" if recover_to_gateway_generation is None else "placement.recover_to_gateway"
    audit(
        actor,
        action,
        "session",
        session.key,
        {
            "before": f"{before[0]}@{before[1]}" if before else "local",
            "after": f"{placement.state}@{placement.generation}",
            "environmentId": placement.environment_id,
        },
    )
    return placement


def _reclaim(session: Session, recover_to_gateway_generation: int | None, actor: Actor) -> Placement:
    placement = Placement.objects.filter(pk=session.pk).first()
    state = placement.state if placement is not None else "local"
    if recover_to_gateway_generation is not None:
        if placement is None or placement.state != S.FAILED or placement.generation != recover_to_gateway_generation:
            found = f"{placement.state}@{placement.generation}" if placement is not None else "missing"
            raise InvalidRequest(
                f"Worker session placement {session.session_id} changed: expected "
                f"failed@{recover_to_gateway_generation}, found {found}"
            )
    if state == S.ACTIVE:
        environment = WorkerEnvironment.objects.filter(pk=placement.environment_id).first()
        return reclaim_active(session, placement, environment, STOPPED_BY_OPERATOR, actor=actor)
    if state in (S.REQUESTED, S.PROVISIONING):
        placement = fail_in_flight(session, placement, PROVISIONING_CANCELED, actor=actor)
        return _to_local(session, placement, actor=actor, reason=PROVISIONING_CANCELED)
    if state == S.FAILED:
        errors = teardown_environment(
            placement.environment_id, terminal_state="failed", error=placement.terminal_reason
        )
        reason = "recovered to the gateway"
        if errors and recover_to_gateway_generation is None:
            if placement.recovery_error != FORCED_WORKER_ABANDONMENT_ERROR:
                store.placement_fail(
                    session=session,
                    recovery_error=composed_error(placement.terminal_reason or placement.recovery_error, errors),
                    actor=actor,
                )
            raise Unavailable(f"Cloud worker teardown failed: {'; '.join(errors)}", retryable=True)
        if errors:
            # "Continue on Gateway" for the exact failed generation: the operator gives the remote worker up
            # (say, a removed node that can never confirm its stop). The environment keeps its pending
            # teardown for the sweep; the session no longer waits for it.
            reason = f"recovered to the gateway; teardown pending: {'; '.join(errors)}"
        with transaction.atomic():
            placement = _to_local(session, placement, actor=actor, reason=reason)
            # A move that failed on this source is over too: left behind, it would refuse every later move.
            PlacementMove.objects.filter(session=session).delete()
        return placement
    raise InvalidRequest(f"Session {session.key} cannot stop cloud worker from placement {state}")


def _to_local(session: Session, placement: Placement, *, actor: Actor, reason: str) -> Placement:
    return store.placement_transition(
        session=session,
        from_state=S.FAILED,
        to_state=S.LOCAL,
        expected_generation=placement.generation,
        actor=actor,
        reason=reason,
    )


def environment_destroy(*, environment_id: str, force: bool, actor: Actor) -> WorkerEnvironment:
    """Tear an environment down. An attached session blocks it unless ``force``, which first fails that
    session's placement with the forced-abandonment error (its work is given up, on purpose)."""
    environment = WorkerEnvironment.objects.filter(pk=environment_id).first()
    if environment is None:
        raise NotFound(f"worker environment not found: {environment_id}")
    if environment.state in TERMINAL_ENVIRONMENT_STATES:
        return environment
    owners = list(
        Placement.objects.filter(environment_id=environment_id, state__in=(S.ACTIVE, S.DRAINING, S.RECONCILING))
    )
    if owners and not force:
        raise InvalidRequest(
            f"worker environment {environment_id} is attached to a session; stop its cloud worker first "
            "or destroy with force"
        )
    with transaction.atomic():
        sessions = Session.objects.in_bulk([p.pk for p in owners])
        for owner in owners:
            fail_in_flight(sessions[owner.pk], owner, FORCED_WORKER_ABANDONMENT_ERROR, actor=actor, teardown=False)
    errors = teardown_environment(environment_id, terminal_state="destroyed")
    if errors:
        raise Unavailable(f"Worker environment teardown failed: {'; '.join(errors)}", retryable=True)
    destroyed = WorkerEnvironment.objects.get(pk=environment_id)
    data = {"before": environment.state, "after": destroyed.state, "force": force}
    if owners:
        data["abandonedSessions"] = sorted(sessions[owner.pk].key for owner in owners)
    audit(actor, "environment.destroy", "environment", environment_id, data)
    return destroyed


def placement_force_fail(*, session: Session, expected_state: str, expected_generation: int, actor: Actor) -> Placement:
    """Fail a placement an operator gave up on, exactly as recovery fails an interrupted one
    (``fail_in_flight``: a worker that owns it loses ownership first, then its environment is torn
    down; a teardown error joins the ``recovery_error``). Only for the state and generation the
    operator saw; audited with the placement's state and generation before and after."""
    placement = Placement.objects.filter(pk=session.pk).first()
    found = f"{placement.state}@{placement.generation}" if placement is not None else "missing"
    if found != f"{expected_state}@{expected_generation}":
        raise InvalidRequest(
            f"Worker session placement {session.session_id} changed: expected "
            f"{expected_state}@{expected_generation}, found {found}"
        )
    if placement.state not in FORCE_FAILABLE_STATES:
        raise InvalidRequest(f"Cannot fail worker session placement from {placement.state}")
    if PlacementMove.objects.filter(session=session).exists():
        # A move carries its own recovery (``move_recover``), which a forced failure would strand.
        raise InvalidRequest(f"Session {session.key} is being moved; its move finishes or fails on its own")
    failed = fail_in_flight(session, placement, FAILED_BY_OPERATOR, actor=actor)
    audit(
        actor,
        "placement.fail",
        "session",
        session.key,
        {
            "before": found,
            "after": f"{failed.state}@{failed.generation}",
            "environmentId": failed.environment_id,
            "reason": failed.recovery_error,
        },
    )
    return failed
