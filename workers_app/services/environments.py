"""The worker environment store (workers.md §2): every change is one compare-and-set in one transaction.

An environment has no generation; its compare-and-set is on ``(state, owner_epoch)``, the pair that
says "this box, owned by this owner": a writer that lost a race (the state moved, or ownership
changed hands) changes nothing and gets the exact "changed" error. Terminal facts of a teardown
(``destroy_requested_at_ms``, ``teardown_terminal_state``) are written once: the first cause wins.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from django.db import IntegrityError, transaction

from gateway.exceptions import Conflict, InvalidRequest

from ..models import (
    ENVIRONMENT_TRANSITIONS,
    TERMINAL_ENVIRONMENT_STATES,
    EnvironmentState,
    TeardownTerminalState,
    WorkerEnvironment,
)
from ..providers import WorkerLease, WorkerProfile
from .placements import bounded_worker_error, now_ms

logger = logging.getLogger(__name__)

E = EnvironmentState
PROVIDER_LOST_LEASE_ERROR = "Worker provider no longer recognizes the lease"
DISAPPEARED_BEFORE_TEARDOWN_ERROR = "Worker environment disappeared before teardown was requested"
LEASE_FIELDS = ("lease_id", "node_device_id", "ssh_host", "ssh_port", "ssh_user", "ssh_host_key", "ssh_key_ref")


def environment_id_for(idempotency_key: str) -> str:
    """``worker:`` + the first 32 hex of sha256(key): the same dispatch always names the same environment."""
    return "worker:" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]


def dispatch_idempotency_key(session_id: str, generation: int) -> str:
    return f"session-dispatch:{session_id}:{generation}"


def _changed(environment_id: str, state: str, epoch: int, found: WorkerEnvironment | None) -> Conflict:
    now = f"{found.state}@{found.owner_epoch}" if found is not None else "missing"
    return Conflict(
        f"Worker environment {environment_id} changed: expected {state}@{epoch}, found {now}",
        details={"code": "ENVIRONMENT_CHANGED"},
    )


def _cas(environment: WorkerEnvironment, changes: dict[str, Any]) -> WorkerEnvironment:
    """Write ``changes`` only if the row is still in the state and epoch ``environment`` was read in."""
    written = WorkerEnvironment.objects.filter(
        pk=environment.pk, state=environment.state, owner_epoch=environment.owner_epoch
    ).update(**changes)
    if not written:
        raise _changed(
            environment.pk,
            environment.state,
            environment.owner_epoch,
            WorkerEnvironment.objects.filter(pk=environment.pk).first(),
        )
    _log_on_commit(environment, changes)
    for name, value in changes.items():
        setattr(environment, name, value)
    return environment


def _log_on_commit(environment: WorkerEnvironment, changes: dict[str, Any]) -> None:
    """A state change or a teardown request, with the error that explains it, once it commits."""
    to_state = changes.get("state", environment.state)
    teardown = changes.get("destroy_requested_at_ms") is not None and environment.destroy_requested_at_ms is None
    if to_state == environment.state and not teardown:
        return
    change = f"{environment.state} -> {to_state}" if to_state != environment.state else environment.state
    if teardown:
        change += f", teardown requested ({changes.get('teardown_terminal_state')})"
    line = (environment.pk, change, changes.get("last_error") or "-")
    transaction.on_commit(lambda: logger.info("worker environment %s: %s: %s", *line))


def _state_change(environment: WorkerEnvironment, to_state: str, at: int) -> dict[str, Any]:
    if to_state not in ENVIRONMENT_TRANSITIONS[environment.state]:
        raise InvalidRequest(f"Illegal worker environment transition: {environment.state} -> {to_state}")
    changes: dict[str, Any] = {"state": to_state, "updated_at_ms": at, "state_changed_at_ms": at}
    if to_state == E.IDLE:
        changes["idle_since_at_ms"] = at
    elif environment.state == E.IDLE:
        changes["idle_since_at_ms"] = None
    return changes


def environment_get(environment_id: str) -> WorkerEnvironment | None:
    return WorkerEnvironment.objects.filter(pk=environment_id).first()


def environment_request(*, environment_id: str, profile: WorkerProfile, operation_id: str) -> WorkerEnvironment:
    """The environment record of one dispatch, ``requested``; the same operation finds its own record again."""
    at = now_ms()
    try:
        with transaction.atomic():
            return WorkerEnvironment.objects.create(
                environment_id=environment_id,
                provider_id=profile.provider_id,
                profile_id=profile.id,
                profile_snapshot=profile.snapshot(),
                provision_operation_id=operation_id,
                bootstrap_install_kind=profile.install,
                state=E.REQUESTED,
                created_at_ms=at,
                updated_at_ms=at,
                state_changed_at_ms=at,
            )
    except IntegrityError:
        existing = environment_get(environment_id)
        if existing is None or existing.provision_operation_id != operation_id:
            raise Conflict(f"Worker environment {environment_id} belongs to another operation") from None
        return existing


@transaction.atomic
def environment_transition(
    *, environment_id: str, from_state: str, to_state: str, owner_epoch: int, patch: dict[str, Any] | None = None
) -> WorkerEnvironment:
    environment = WorkerEnvironment.objects.filter(pk=environment_id).first()
    if environment is None or environment.state != from_state or environment.owner_epoch != owner_epoch:
        raise _changed(environment_id, from_state, owner_epoch, environment)
    return _cas(environment, {**(patch or {}), **_state_change(environment, to_state, now_ms())})


@transaction.atomic
def environment_record_lease(*, environment_id: str, lease: WorkerLease) -> WorkerEnvironment:
    """provisioning → bootstrapping with the provider's lease (its SSH endpoint or node)."""
    environment = WorkerEnvironment.objects.filter(pk=environment_id).first()
    if environment is None or environment.state != E.PROVISIONING:
        raise _changed(environment_id, E.PROVISIONING, environment.owner_epoch if environment else 0, environment)
    changes: dict[str, Any] = {
        "lease_id": lease.lease_id,
        "shared_host": lease.shared_host,
        "node_device_id": lease.node_device_id,
        "last_error": None,
    }
    if lease.ssh is not None:
        changes.update(
            ssh_host=lease.ssh.host,
            ssh_port=lease.ssh.port,
            ssh_user=lease.ssh.user,
            ssh_host_key=lease.ssh.host_key,
            ssh_key_ref=lease.ssh.key_ref,
        )
    return _cas(environment, {**changes, **_state_change(environment, E.BOOTSTRAPPING, now_ms())})


@transaction.atomic
def environment_attach_session(*, environment_id: str, session_id: str) -> WorkerEnvironment:
    """ready/idle → attached to exactly this session, under a new owner epoch (the fencing token)."""
    environment = WorkerEnvironment.objects.filter(pk=environment_id).first()
    if environment is None or environment.state not in (E.READY, E.IDLE) or environment.destroy_requested_at_ms:
        raise InvalidRequest(f"Worker environment {environment_id} cannot attach a session")
    changes = {
        **_state_change(environment, E.ATTACHED, now_ms()),
        "owner_epoch": environment.owner_epoch + 1,
        "attached_session_ids": [session_id],
        "workspace_session_id": session_id,
    }
    return _cas(environment, changes)


def environment_follow_session(*, environment_id: str, previous_session_id: str, session_id: str) -> bool:
    """The session an environment is attached to started a new transcript generation (``sessions.reset``): the
    attachment follows its new id, under the same owner epoch (the worker and its workspace stay the session's,
    still under ``workspace_session_id``, the id the node knows them by).
    Called inside the reset's transaction, the session row locked. False when the environment is not attached
    to exactly the previous id (another owner, released): nothing changes."""
    environment = WorkerEnvironment.objects.filter(pk=environment_id).first()
    if environment is None or environment.attached_session_ids != [previous_session_id]:
        return False
    _cas(environment, {"attached_session_ids": [session_id], "updated_at_ms": now_ms()})
    return True


@transaction.atomic
def environment_record_error(*, environment_id: str, error: str) -> bool:
    """Remember why the last look at an environment failed; nothing else changes."""
    return bool(
        WorkerEnvironment.objects.filter(pk=environment_id).update(
            last_error=bounded_worker_error(error), updated_at_ms=now_ms()
        )
    )


@transaction.atomic
def environment_request_destroy(*, environment_id: str, terminal_state: str, error: str | None) -> WorkerEnvironment:
    """Mark teardown as wanted. The first request's time, terminal state and error win; a repeat changes nothing."""
    environment = WorkerEnvironment.objects.select_for_update().filter(pk=environment_id).first()
    if environment is None:
        raise InvalidRequest(f"Worker environment {environment_id} not found")
    if environment.destroy_requested_at_ms is not None or environment.state in TERMINAL_ENVIRONMENT_STATES:
        return environment
    changes: dict[str, Any] = {
        "destroy_requested_at_ms": now_ms(),
        "teardown_terminal_state": terminal_state,
        "updated_at_ms": now_ms(),
    }
    if error:
        changes["last_error"] = bounded_worker_error(error)
    return _cas(environment, changes)


@transaction.atomic
def environment_finish_destroy(*, environment_id: str) -> WorkerEnvironment:
    """After the provider proved the lease released: the teardown's terminal state, lease and owners cleared.

    Either terminal state is entered from any state here, as OpenClaw's ``finishDestroy`` does: the
    provider proved the box gone, whatever it was doing, so the intermediate draining/destroying
    steps would record nothing true.
    """
    environment = WorkerEnvironment.objects.filter(pk=environment_id).first()
    if environment is None:
        raise InvalidRequest(f"Worker environment {environment_id} not found")
    if environment.state in TERMINAL_ENVIRONMENT_STATES:
        return environment
    try:
        return _cas(environment, _finished(environment))
    except Conflict:
        # Another teardown of the same environment (a concurrent reclaim, the sweep) finished it first: the
        # outcome this one wanted. Any other change is a real conflict.
        current = WorkerEnvironment.objects.filter(pk=environment_id).first()
        if current is not None and current.state in TERMINAL_ENVIRONMENT_STATES:
            return current
        raise


def _finished(environment: WorkerEnvironment) -> dict[str, Any]:
    """The changes that end a teardown: its terminal state, with the lease and owners released."""
    at = now_ms()
    released: dict[str, Any] = {
        "attached_session_ids": [],
        "workspace_session_id": None,
        "updated_at_ms": at,
        "state_changed_at_ms": at,
    }
    if environment.teardown_terminal_state == TeardownTerminalState.FAILED or environment.lease_id is None:
        return {
            **released,
            **dict.fromkeys(LEASE_FIELDS),
            "state": E.FAILED,
            "teardown_terminal_state": TeardownTerminalState.FAILED,
            "destroy_requested_at_ms": environment.destroy_requested_at_ms or at,
        }
    # destroyed keeps its lease id: the provider's record of what was released.
    return {
        **released,
        "state": E.DESTROYED,
        "teardown_terminal_state": TeardownTerminalState.DESTROYED,
        "destroy_requested_at_ms": environment.destroy_requested_at_ms or at,
        "idle_since_at_ms": None,
    }


@transaction.atomic
def environment_orphan(*, environment_id: str, error: str) -> WorkerEnvironment:
    """A leased environment nobody can stop any more: ``orphaned`` (terminal; never resurrected)."""
    environment = WorkerEnvironment.objects.filter(pk=environment_id).first()
    if environment is None:
        raise InvalidRequest(f"Worker environment {environment_id} not found")
    if environment.state == E.ORPHANED:
        return environment
    return _cas(
        environment,
        {**_state_change(environment, E.ORPHANED, now_ms()), "last_error": bounded_worker_error(error)},
    )


__all__ = [
    "DISAPPEARED_BEFORE_TEARDOWN_ERROR",
    "PROVIDER_LOST_LEASE_ERROR",
    "dispatch_idempotency_key",
    "environment_attach_session",
    "environment_finish_destroy",
    "environment_get",
    "environment_id_for",
    "environment_orphan",
    "environment_record_error",
    "environment_record_lease",
    "environment_request",
    "environment_request_destroy",
    "environment_transition",
]
