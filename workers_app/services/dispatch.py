"""``sessions.dispatch`` (workers.md §4.1): close local admission, lease an environment, bring the
session up on it — one compare-and-set per stage, each stage visible as a ``sessions.changed`` event.

The request is checked and the barrier taken in the caller's transaction (:func:`dispatch_start`);
the stages run in a task (:func:`dispatch_advance`, Celery or in-process) that guards on the
placement's state and generation first, so a duplicate or redelivered task does nothing, and a
task that finds its stage half-done resumes it (the provider's ``provision`` is idempotent per
operation id). Each stage records who drives it; recovery fails a stage whose driver is gone.
"""

from __future__ import annotations

import logging
import uuid

from django.db import transaction

from devices_app.models import PairedDevice
from gateway import selectors as gateway_selectors
from gateway.background import executor_label
from gateway.exceptions import GatewayError, InvalidRequest, NotFound
from sessions_app.models import Session

from ..models import (
    TERMINAL_ENVIRONMENT_STATES,
    EnvironmentState,
    NodeWorkerHost,
    Placement,
    PlacementState,
    WorkerEnvironment,
)
from ..nodes.device_provider import PROVIDER_ID as DEVICE_PROVIDER_ID
from ..nodes.device_provider import device_profile, not_connected
from ..nodes.inventory import openclaw_update_required, update_required_message
from ..nodes.openclaw.dialect import node_speaks_openclaw
from ..profiles import profile_for_environment, profile_get, profiles_all
from ..providers import WorkerProfile, WorkerProvider, WorkerProviderError
from ..runtimes import worker_runtimes
from . import environments as envs
from . import placements as store
from .placements import Actor
from .teardown import call_provider, fail_in_flight, provider_for

S = PlacementState
E = EnvironmentState
logger = logging.getLogger(__name__)
IN_FLIGHT = (S.REQUESTED, S.PROVISIONING, S.SYNCING, S.STARTING)


def device_ineligibility(device_id: str) -> str | None:
    """Why a paired node cannot take this session now (workers.md §5.5), or None."""
    if not PairedDevice.objects.filter(device_id=device_id, is_node=True).exists():
        return f"device worker is not a paired node host: {device_id}"
    connection = gateway_selectors.live_node_connection(device_id)
    if connection is None:
        return not_connected(device_id)
    host = NodeWorkerHost.objects.filter(node_id=device_id, conn_id=str(connection.conn_id)).first()
    worker_host = host.worker_host if host is not None else None
    if host is not None and (
        host.update_required or (openclaw_update_required(worker_host) and node_speaks_openclaw(device_id))
    ):
        return update_required_message(device_id)
    if not worker_host or not worker_host.get("enabled") or worker_runtimes.for_provider("device") is None:
        # Without a declaration of this connection, or without a worker runtime on this gateway, the
        # node cannot take the session whatever it runs.
        return (
            f"device node {device_id} is connected but cannot host sessions; enable session hosting "
            "(nodeHost.workerRuns.enabled), update the node if needed, then reconnect it"
        )
    capacity = worker_host["capacity"]
    if capacity["available"] + capacity.get("reclaimableIdle", 0) <= 0:
        return (
            f"device worker is at capacity (all worker slots in use): {device_id}; "
            "stop an existing worker environment or retry when a slot is free"
        )
    return None


def resolve_target(*, profile_id: str | None, device_id: str | None) -> str:
    """The dispatch target as the placement records it: ``profile:<id>`` or ``device:<id>``."""
    if device_id is not None:
        problem = device_ineligibility(device_id)
        if problem:
            raise InvalidRequest(problem)
        return f"device:{device_id}"
    if profile_id is None:
        raise InvalidRequest("worker dispatch target is missing")
    if not profiles_all():
        raise InvalidRequest("cloud worker dispatch is not configured")
    profile = profile_get(profile_id)
    if profile is None:
        raise NotFound(f"worker profile not found: {profile_id}", details={"code": "profile_not_found"})
    profile_device_id = profile.settings.get("deviceId") if profile.provider_id == DEVICE_PROVIDER_ID else None
    if isinstance(profile_device_id, str) and profile_device_id:
        # A profile that names a paired node is refused on the same facts as a device target, before
        # anything is written (a placement failed on provision would hold the session until abandoned).
        problem = device_ineligibility(profile_device_id)
        if problem:
            raise InvalidRequest(problem)
    return f"profile:{profile_id}"


def _environment_gone(environment_id: str | None) -> bool:
    if not environment_id:
        return True
    environment = WorkerEnvironment.objects.filter(pk=environment_id).first()
    return environment is None or environment.state in TERMINAL_ENVIRONMENT_STATES


def ensure_placeable(session: Session) -> None:
    """A session whose turns run in an agent harness of this gateway (native threads) cannot run on a worker."""
    if session.agent_harness_id:
        raise InvalidRequest(f"runtime {session.agent_harness_id} lacks cloud placement support")


def ensure_not_archived(session: Session) -> None:
    """The session's own state answers before anything about the target (configured profiles, the node)."""
    if session.archived_at is not None:
        raise InvalidRequest("cannot dispatch an archived session")


def _identical_in_flight(placement: Placement | None, target: str) -> bool:
    return placement is not None and placement.state in IN_FLIGHT and placement.dispatch_target == target


def dispatch_start(*, session: Session, target: str, actor: Actor) -> tuple[Placement, bool]:
    """Take the barrier and name the environment; returns ``(placement, started)`` — ``started`` is False
    when an identical dispatch is already under way and this call joins it."""
    ensure_not_archived(session)
    ensure_placeable(session)
    current = Placement.objects.filter(pk=session.pk).first()
    if current is not None:
        if _identical_in_flight(current, target):
            return current, False
        if current.state in (*IN_FLIGHT, S.ACTIVE, S.DRAINING, S.RECONCILING):
            raise InvalidRequest(f"session cannot dispatch from placement {current.state}")
        if current.state == S.FAILED and not _environment_gone(current.environment_id):
            if (current.dispatch_target or "").startswith("device:"):
                raise InvalidRequest(
                    "device worker placement must be abandoned before redispatch; use Continue on Gateway"
                )
            raise InvalidRequest("cloud worker environment must be stopped before redispatch; use Stop cloud worker")
    try:
        return _take_barrier(session, target=target, actor=actor), True
    except InvalidRequest:
        # A concurrent identical dispatch took the barrier after the check above: this call joins it.
        current = Placement.objects.filter(pk=session.pk).first()
        if _identical_in_flight(current, target):
            return current, False
        raise


def _take_barrier(session: Session, *, target: str, actor: Actor) -> Placement:
    kind, _, target_id = target.partition(":")
    with transaction.atomic():
        placement = store.placement_start_dispatch(
            session=session, target=target, owner=executor_label(), actor=actor, reason=f"dispatch to {target}"
        )
        idempotency_key = envs.dispatch_idempotency_key(session.session_id, placement.generation)
        environment_id = envs.environment_id_for(idempotency_key)
        profile = profile_get(target_id) if kind == "profile" else device_profile(target_id)
        if profile is not None:
            envs.environment_request(
                environment_id=environment_id, profile=profile, operation_id=f"provision:{environment_id}"
            )
        return store.placement_transition(
            session=session,
            from_state=S.REQUESTED,
            to_state=S.PROVISIONING,
            expected_generation=placement.generation,
            patch={"environment_id": environment_id},
            actor=actor,
            reason=f"provisioning {environment_id}",
        )


def dispatch_advance(*, session_pk: int, generation: int) -> str:
    """Run the stages of one dispatch from where they stand; returns the placement's state afterwards."""
    session = Session.objects.filter(pk=session_pk).first()
    placement = Placement.objects.filter(pk=session_pk).first()
    if session is None or placement is None or placement.generation != generation:
        return "stale"
    if placement.state != S.PROVISIONING:
        return placement.state  # another driver took it further, or it ended
    actor = Actor(f"dispatch:{executor_label()}")
    # This driver now owns the stage (recovery watches it); a racing duplicate changes nothing.
    if not Placement.objects.filter(pk=session_pk, state=S.PROVISIONING, generation=generation).update(
        dispatch_owner=executor_label()
    ):
        return "stale"
    try:
        return _advance(session, placement, actor).state
    except (WorkerProviderError, GatewayError) as failure:
        return _failed(session, failure.message, actor=actor)
    except Exception:
        # A bug (ours, or a runtime's): the placement fails now rather than at the stage deadline, and
        # its reason names an error id, not the exception's text.
        error_id = uuid.uuid4().hex[:12]
        logger.exception("dispatch of session %s failed (errorId=%s)", session.session_id, error_id)
        return _failed(session, f"internal error (errorId={error_id})", actor=actor)


def _failed(session: Session, message: str, *, actor: Actor) -> str:
    current = Placement.objects.filter(pk=session.pk).first()
    if current is None or current.state not in IN_FLIGHT:
        return current.state if current else "stale"
    error = f"Worker dispatch failed in {current.state}: {message}"
    return fail_in_flight(session, current, error, actor=actor).state


def _advance(session: Session, placement: Placement, actor: Actor) -> Placement:
    environment = envs.environment_get(placement.environment_id)
    if environment is None:
        raise WorkerProviderError(f"worker environment {placement.environment_id} is missing")
    provider = provider_for(environment)
    profile = profile_for_environment(environment.provider_id, environment.profile_id, environment.profile_snapshot)
    if environment.state == E.REQUESTED:
        environment = envs.environment_transition(
            environment_id=environment.pk,
            from_state=E.REQUESTED,
            to_state=E.PROVISIONING,
            owner_epoch=environment.owner_epoch,
        )
    if environment.state == E.PROVISIONING:
        operation_id = environment.provision_operation_id
        lease = call_provider(provider.id, "provision", provider.provision, profile, operation_id, key=operation_id)
        try:
            environment = envs.environment_record_lease(environment_id=environment.pk, lease=lease)
        except GatewayError:
            _release_unrecorded_lease(environment.pk, provider, profile, lease.lease_id)
            raise
    runtime = worker_runtimes.for_provider(environment.provider_id)
    if runtime is None:
        raise WorkerProviderError(
            f"this gateway has no worker runtime that can bootstrap {environment.provider_id} environments"
        )
    if environment.state == E.BOOTSTRAPPING:
        receipt = runtime.bootstrap(environment)
        environment = envs.environment_transition(
            environment_id=environment.pk,
            from_state=E.BOOTSTRAPPING,
            to_state=E.READY,
            owner_epoch=environment.owner_epoch,
            patch={
                "bootstrap_bundle_hash": receipt.bundle_hash,
                "bootstrap_openclaw_version": receipt.openclaw_version,
                "bootstrap_protocol_features": receipt.protocol_features,
                "bootstrap_install_kind": receipt.install_kind,
                "node_device_id": receipt.node_device_id or environment.node_device_id,
            },
        )
    placement = store.placement_transition(
        session=session,
        from_state=S.PROVISIONING,
        to_state=S.SYNCING,
        expected_generation=placement.generation,
        patch={"worker_bundle_hash": environment.bootstrap_bundle_hash},
        actor=actor,
    )
    synced = runtime.sync_workspace(session, placement, environment)
    placement = store.placement_transition(
        session=session,
        from_state=S.SYNCING,
        to_state=S.STARTING,
        expected_generation=placement.generation,
        patch={"workspace_base_manifest_ref": synced.manifest_ref, "remote_workspace_dir": synced.remote_workspace_dir},
        actor=actor,
    )
    runtime.start(session, placement, environment)
    environment = envs.environment_attach_session(environment_id=environment.pk, session_id=session.session_id)
    return store.placement_transition(
        session=session,
        from_state=S.STARTING,
        to_state=S.ACTIVE,
        expected_generation=placement.generation,
        patch={"active_owner_epoch": environment.owner_epoch},
        actor=actor,
    )


def _release_unrecorded_lease(
    environment_id: str, provider: WorkerProvider, profile: WorkerProfile, lease_id: str
) -> None:
    """The environment was torn down (a cancel, recovery) while the provider was leasing: the lease it just
    returned is on no record that a teardown could find, so it is released here. (A duplicate driver that
    recorded the same lease first leaves the environment alive: its lease is not touched.)"""
    current = envs.environment_get(environment_id)
    if current is None or current.destroy_requested_at_ms is not None or current.state in TERMINAL_ENVIRONMENT_STATES:
        call_provider(provider.id, "destroy", provider.destroy, lease_id, profile, key=lease_id)


__all__ = [
    "device_ineligibility",
    "dispatch_advance",
    "dispatch_start",
    "ensure_not_archived",
    "ensure_placeable",
    "resolve_target",
]
