"""Calling providers with a deadline, tearing environments down, and taking a placement back from its worker.

Provider calls run in a small thread pool so that a provider that hangs (a third party's, or a
host that accepts and never answers) costs its deadline, not the sweep: the call is abandoned and
recorded as a transient failure, and nothing else changes. The caller waits for it without a database
connection (a provider's own queries need one from the same pool), and identical calls made at the same
time (the same operation on the same lease) share one provider call.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from django.conf import settings
from django.db import close_old_connections

from gateway.background import release_database_connections
from sessions_app.models import Session

from ..models import TERMINAL_ENVIRONMENT_STATES, EnvironmentState, Placement, PlacementState, WorkerEnvironment
from ..profiles import profile_for_environment
from ..providers import (
    CREDENTIALS_REVOKED,
    INSPECTION_STATUSES,
    Inspection,
    WorkerProvider,
    WorkerProviderError,
    providers,
)
from . import environments as envs
from . import placements as store
from .placements import RECOVERY_ERROR_LIMIT, Actor, bounded_worker_error

logger = logging.getLogger(__name__)

S = PlacementState
E = EnvironmentState
GONE_STATES = TERMINAL_ENVIRONMENT_STATES
DESTROY_ERROR_SEPARATOR = "; environment destroy: "
UNAVAILABLE_STATES = frozenset({E.DRAINING, E.DESTROYING, *TERMINAL_ENVIRONMENT_STATES})

_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="worker-provider")
# (provider, operation, lease or operation id) → the provider call under way for it, which a caller asking
# for the same thing at the same time waits for instead of starting another.
_in_flight: dict[tuple[str, str, str], Future] = {}
_in_flight_lock = threading.Lock()


def provider_timeout_s() -> float:
    return settings.OPENCLAW_WORKERS["PROVIDER_TIMEOUT_MS"] / 1000


def _run_provider_call[T](fn: Callable[..., T], *args: Any) -> T:
    try:
        return fn(*args)
    finally:
        # The pool's threads live as long as the process: a connection a provider's queries (the device
        # and local providers read the node's records) left checked out would never go back to the
        # database pool, and would keep a session open on the database until the process exits.
        close_old_connections()


def _shared_call(key: tuple[str, str, str], fn: Callable[..., Any], args: tuple) -> Future:
    with _in_flight_lock:
        future = _in_flight.get(key)
        if future is not None:
            return future
        future = _in_flight[key] = _pool.submit(_run_provider_call, fn, *args)
    future.add_done_callback(lambda done: _forget(key, done))
    return future


def _forget(key: tuple[str, str, str], done: Future) -> None:
    with _in_flight_lock:
        if _in_flight.get(key) is done:
            del _in_flight[key]


def call_provider[T](provider_id: str, operation: str, fn: Callable[..., T], *args: Any, key: str) -> T:
    """``fn(*args)`` bounded by the provider deadline; a hang or a crash becomes a ``WorkerProviderError``.

    ``key`` names what the call acts on (the lease, or the provision's operation id): a call for the same
    provider, operation and key already under way is waited for instead of made again."""
    future = _shared_call((provider_id, operation, key), fn, args)
    # The provider's queries (the local and device providers read and write the node's records) take a
    # connection from the same pool: one held here while waiting could be the one they wait for.
    release_database_connections()
    try:
        return future.result(timeout=provider_timeout_s())
    except FutureTimeout:
        raise WorkerProviderError(
            f"Worker provider {provider_id} {operation} timed out after {int(provider_timeout_s() * 1000)} ms"
        ) from None
    except WorkerProviderError:
        raise
    except Exception as error:
        # A provider's own bug: reported by kind, its text logged (it may carry host details).
        logger.exception("worker provider %s %s failed", provider_id, operation)
        raise WorkerProviderError(f"Worker provider {provider_id} {operation} failed: {type(error).__name__}") from None


def provider_for(environment: WorkerEnvironment) -> WorkerProvider:
    provider = providers.get(environment.provider_id)
    if provider is None:
        raise WorkerProviderError(f"Worker provider {environment.provider_id} is not registered on this gateway")
    return provider


def inspect_environment(environment: WorkerEnvironment) -> Inspection:
    """The provider's view of the lease, validated (workers.md §3.1); raises on a transient failure."""
    provider = provider_for(environment)
    profile = profile_for_environment(environment.provider_id, environment.profile_id, environment.profile_snapshot)
    result = call_provider(
        environment.provider_id, "inspect", provider.inspect, environment.lease_id, profile, key=environment.lease_id
    )
    if not isinstance(result, Inspection) or result.status not in INSPECTION_STATUSES:
        raise WorkerProviderError("Worker provider returned an invalid inspection status")
    if result.shared_host is not None and result.status != "active":
        raise WorkerProviderError("Worker provider returned an invalid inspection result")
    return result


def teardown_environment(environment_id: str | None, *, terminal_state: str, error: str | None = None) -> list[str]:
    """Request destroy (first cause wins), release the lease through the provider, finish. Returns the
    teardown errors (prefixed as OpenClaw's), empty when the environment is gone or was torn down."""
    if not environment_id:
        return []
    environment = envs.environment_get(environment_id)
    if environment is None or environment.state in GONE_STATES:
        return []
    environment = envs.environment_request_destroy(
        environment_id=environment_id, terminal_state=terminal_state, error=error
    )
    if environment.lease_id is not None:
        try:
            provider = provider_for(environment)
            profile = profile_for_environment(
                environment.provider_id, environment.profile_id, environment.profile_snapshot
            )
            call_provider(
                environment.provider_id,
                "destroy",
                provider.destroy,
                environment.lease_id,
                profile,
                key=environment.lease_id,
            )
        except WorkerProviderError as failure:
            # The cause of the teardown stays first; only the latest destroy failure follows it.
            cause = (environment.last_error or "").split(DESTROY_ERROR_SEPARATOR)[0]
            if cause.startswith("environment destroy: "):
                cause = ""
            detail = f"environment destroy: {failure.message}"
            envs.environment_record_error(
                environment_id=environment_id, error=f"{cause}; {detail}" if cause else detail
            )
            if failure.code != CREDENTIALS_REVOKED:
                return [detail]
            # The worker could not be told to stop, but it no longer holds credentials to act for this
            # gateway: the lease is over; the reason stays on the record and with the placement.
            envs.environment_finish_destroy(environment_id=environment_id)
            return [detail]
    envs.environment_finish_destroy(environment_id=environment_id)
    return []


def composed_error(primary: str, teardown_errors: list[str]) -> str:
    """``bounded(primary); teardown errors…`` cut to the recovery error limit."""
    return bounded_worker_error("; ".join([bounded_worker_error(primary), *teardown_errors]))[:RECOVERY_ERROR_LIMIT]


def disappearance_error(environment: WorkerEnvironment | None) -> str | None:
    """workers.md §3.2: the reason a placement's worker is gone, or None while its environment lives."""
    if environment is None:
        return "cloud worker disappeared: environment record missing"
    if environment.state in GONE_STATES:
        return f"cloud worker disappeared: {environment.last_error or f'environment state {environment.state}'}"
    return None


def is_lost(environment: WorkerEnvironment) -> bool:
    """Its provider said the worker is gone and the teardown is still being finished (retried by the sweep)."""
    return environment.destroy_requested_at_ms is not None and environment.teardown_terminal_state == "failed"


def is_exact_owner(session: Session, placement: Placement, environment: WorkerEnvironment) -> bool:
    return (
        environment.state == E.ATTACHED
        and environment.owner_epoch == placement.active_owner_epoch
        and environment.attached_session_ids == [session.session_id]
        and environment.destroy_requested_at_ms is None
    )


def fence(session: Session, placement: Placement, *, actor: Actor, reason: str) -> Placement:
    """Close the worker's ownership: active → draining → reconciling (whichever steps remain), each for the
    exact owner. The worker's turn claim closes with the reconcile: its turn is interrupted, never replayed."""
    if placement.state == S.ACTIVE:
        placement = store.placement_start_drain(
            session=session,
            environment_id=placement.environment_id,
            owner_epoch=placement.active_owner_epoch,
            expected_generation=placement.generation,
            actor=actor,
            reason=reason,
        )
    if placement.state == S.DRAINING:
        placement = store.placement_start_reconcile(
            session=session,
            environment_id=placement.environment_id,
            owner_epoch=placement.active_owner_epoch,
            expected_generation=placement.generation,
            force_local_claim=True,
            actor=actor,
            reason=reason,
        )
    return placement


def reclaim_active(
    session: Session, placement: Placement, environment: WorkerEnvironment | None, error: str, *, actor: Actor
) -> Placement:
    """Take an active placement back from its worker (workers.md §3.2 ``reclaimActive``).

    active → draining → reconciling, then: the worker is gone → ``failed`` with ``error`` (how
    "cloud worker disappeared: …" is recorded); otherwise the environment is torn down and the
    placement ends ``reclaimed`` (or ``failed`` with the teardown's errors).
    """
    lost = environment is None or environment.state in GONE_STATES or is_lost(environment)
    if lost:
        return fail_owned(session, placement, error, actor=actor)
    placement = fence(session, placement, actor=actor, reason=error)
    if environment.attached_session_ids not in ([], [session.session_id]):
        # Another session owns the box now: never tear down someone else's worker.
        return store.placement_fail(
            session=session, recovery_error=error, expected_generation=placement.generation, actor=actor
        )
    errors = teardown_environment(environment.pk, terminal_state="destroyed")
    if errors:
        return store.placement_fail(
            session=session,
            recovery_error=composed_error(f"Worker reclaim teardown failed: {error}", errors),
            expected_generation=placement.generation,
            actor=actor,
        )
    return store.placement_transition(
        session=session,
        from_state=S.RECONCILING,
        to_state=S.RECLAIMED,
        expected_generation=placement.generation,
        actor=actor,
        reason=error,
    )


def fail_owned(session: Session, placement: Placement, error: str, *, actor: Actor) -> Placement:
    return store.placement_fail_owned(
        session=session,
        environment_id=placement.environment_id,
        owner_epoch=placement.active_owner_epoch,
        expected_generation=placement.generation,
        recovery_error=error,
        actor=actor,
    )


def fail_in_flight(
    session: Session, placement: Placement, error: str, *, actor: Actor, teardown: bool = True
) -> Placement:
    """Fail a placement whose dispatch, move or worker cannot go on, and tear its environment down
    (unless the caller does that). A placement its worker owns is failed first (the worker loses
    ownership before its machine goes) and a teardown error then joins its ``recovery_error``; one
    still on its way is torn down first and failed with the reason and the teardown's errors."""

    def torn_down() -> list[str]:
        return teardown_environment(placement.environment_id, terminal_state="failed", error=error) if teardown else []

    if placement.state in store.OWNED_PATHS:
        placement = fail_owned(session, placement, error, actor=actor)
        errors = torn_down()
        if errors:
            placement = store.placement_fail(session=session, recovery_error=composed_error(error, errors), actor=actor)
        return placement
    errors = torn_down()
    return store.placement_fail(
        session=session,
        recovery_error=composed_error(error, errors),
        expected_generation=placement.generation,
        actor=actor,
    )
