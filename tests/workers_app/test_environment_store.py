"""The worker environment store: legal edges only, compare-and-set on (state, owner epoch), the lease
rule in the database, first teardown facts win (workers.md §2)."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from gateway.exceptions import Conflict, InvalidRequest
from workers_app.models import WorkerEnvironment
from workers_app.providers import SshEndpoint, WorkerLease, WorkerProfile
from workers_app.services import environments as envs

pytestmark = pytest.mark.django_db

PROFILE = WorkerProfile(id="dev", provider_id="static-ssh", settings={"host": "127.0.0.1"})
LEASE = WorkerLease(
    lease_id="static-ssh:op-1",
    shared_host=True,
    ssh=SshEndpoint("127.0.0.1", 2222, "qa", "ssh-ed25519 AAAA", {"source": "file", "id": "/k"}),
)


def requested(environment_id: str = "worker:e1", operation_id: str | None = None) -> WorkerEnvironment:
    operation_id = operation_id or f"op:{environment_id}"
    return envs.environment_request(environment_id=environment_id, profile=PROFILE, operation_id=operation_id)


def leased(environment_id: str = "worker:e1") -> WorkerEnvironment:
    requested(environment_id)
    envs.environment_transition(
        environment_id=environment_id, from_state="requested", to_state="provisioning", owner_epoch=0
    )
    return envs.environment_record_lease(environment_id=environment_id, lease=LEASE)


def ready(environment_id: str = "worker:e1") -> WorkerEnvironment:
    leased(environment_id)
    return envs.environment_transition(
        environment_id=environment_id, from_state="bootstrapping", to_state="ready", owner_epoch=0
    )


def test_the_environment_id_of_a_dispatch_is_deterministic():
    key = envs.dispatch_idempotency_key("s-1", 1)
    assert key == "session-dispatch:s-1:1"
    assert envs.environment_id_for(key) == envs.environment_id_for(key)
    assert envs.environment_id_for(key).startswith("worker:") and len(envs.environment_id_for(key)) == 39
    assert envs.environment_id_for(key) != envs.environment_id_for(envs.dispatch_idempotency_key("s-1", 2))


def test_a_request_is_idempotent_per_operation_and_refuses_another_operation():
    first = requested()
    again = requested()
    assert (again.pk, again.state, again.profile_snapshot["provider"]) == (first.pk, "requested", "static-ssh")
    with pytest.raises(Conflict, match="belongs to another operation"):
        requested(operation_id="op-2")


def test_recording_the_lease_moves_to_bootstrapping_with_the_ssh_endpoint():
    environment = leased()
    assert (environment.state, environment.lease_id, environment.ssh_port) == ("bootstrapping", LEASE.lease_id, 2222)
    assert environment.ssh_key_ref == {"source": "file", "id": "/k"}


def test_an_illegal_edge_and_a_stale_writer_change_nothing():
    requested()
    before = WorkerEnvironment.objects.values().get(pk="worker:e1")
    with pytest.raises(InvalidRequest, match="Illegal worker environment transition: requested -> ready"):
        envs.environment_transition(environment_id="worker:e1", from_state="requested", to_state="ready", owner_epoch=0)
    with pytest.raises(Conflict, match=r"changed: expected provisioning@0, found requested@0"):
        envs.environment_transition(
            environment_id="worker:e1", from_state="provisioning", to_state="bootstrapping", owner_epoch=0
        )
    assert WorkerEnvironment.objects.values().get(pk="worker:e1") == before


def test_attaching_a_session_takes_a_new_owner_epoch():
    ready()
    attached = envs.environment_attach_session(environment_id="worker:e1", session_id="s-1")
    assert (attached.state, attached.owner_epoch, attached.attached_session_ids) == ("attached", 1, ["s-1"])
    with pytest.raises(InvalidRequest, match="cannot attach a session"):
        envs.environment_attach_session(environment_id="worker:e1", session_id="s-2")


def test_the_database_refuses_a_lease_in_an_unleased_state_and_none_in_a_leased_one():
    requested()
    with pytest.raises(IntegrityError), transaction.atomic():
        WorkerEnvironment.objects.filter(pk="worker:e1").update(lease_id="static-ssh:x")
    leased("worker:e2")
    with pytest.raises(IntegrityError), transaction.atomic():
        WorkerEnvironment.objects.filter(pk="worker:e2").update(lease_id=None)


def test_the_first_destroy_request_wins_and_a_failed_teardown_releases_the_lease():
    leased()
    first = envs.environment_request_destroy(environment_id="worker:e1", terminal_state="failed", error="lost it")
    again = envs.environment_request_destroy(environment_id="worker:e1", terminal_state="destroyed", error="other")
    assert (again.destroy_requested_at_ms, again.teardown_terminal_state, again.last_error) == (
        first.destroy_requested_at_ms,
        "failed",
        "lost it",
    )
    done = envs.environment_finish_destroy(environment_id="worker:e1")
    assert (done.state, done.lease_id, done.attached_session_ids, done.ssh_host) == ("failed", None, [], None)
    assert done.last_error == "lost it"
    assert envs.environment_finish_destroy(environment_id="worker:e1").state == "failed"  # idempotent


def test_a_clean_teardown_ends_destroyed_and_keeps_the_lease_record():
    ready()
    envs.environment_request_destroy(environment_id="worker:e1", terminal_state="destroyed", error=None)
    done = envs.environment_finish_destroy(environment_id="worker:e1")
    assert (done.state, done.lease_id, done.teardown_terminal_state) == ("destroyed", LEASE.lease_id, "destroyed")


def test_errors_are_bounded_and_an_orphan_is_never_resurrected():
    ready()
    envs.environment_record_error(environment_id="worker:e1", error="x" * 5000)
    assert len(WorkerEnvironment.objects.get(pk="worker:e1").last_error) == 1024
    orphan = envs.environment_orphan(environment_id="worker:e1", error="nobody can stop it")
    assert (orphan.state, orphan.last_error) == ("orphaned", "nobody can stop it")
    assert envs.environment_finish_destroy(environment_id="worker:e1").state == "orphaned"
    with pytest.raises(InvalidRequest, match="Illegal worker environment transition: orphaned -> idle"):
        envs.environment_transition(environment_id="worker:e1", from_state="orphaned", to_state="idle", owner_epoch=0)
