"""Recovery (workers.md §3): a vanished worker fails exactly its own placement, once; a healthy one is never
touched; interrupted dispatches end cleanly; a provider that raises or hangs changes nothing but ``lastError``."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field

import pytest
from django.db import connection, connections
from django.utils import timezone

from gateway.models import GatewayProcess
from sessions_app.models import Session
from workers_app.models import Placement, PlacementHistory, WorkerEnvironment
from workers_app.providers import Inspection, WorkerProfile, WorkerProviderError, providers
from workers_app.services import environments as envs
from workers_app.services import placements as store
from workers_app.services.recovery import workers_recover_startup, workers_recovery_sweep

from .test_placement_store import DISPATCH_STEPS, ENV, dispatch_to_active, dispatch_to_active_on, make_session, walk

pytestmark = pytest.mark.django_db

LOST = "Worker provider no longer recognizes the lease"


@dataclass
class ScriptedProvider:
    """A provider whose answers the test sets: a status, an exception, or a hang (a third party's provider
    registered the way any app registers one)."""

    id: str = "scripted"
    status: str = "active"
    inspect_error: Exception | None = None
    destroy_error: Exception | None = None
    hang: threading.Event | None = None
    destroyed: list[str] = field(default_factory=list)
    # Reads the database in inspect, as the device and local providers do; the connection it used is kept.
    reads_database: bool = False
    inspect_connections: list = field(default_factory=list)

    def validate_settings(self, settings):
        return None

    def provision(self, profile, operation_id):
        raise WorkerProviderError("not used here")

    def inspect(self, lease_id, profile):
        if self.hang is not None:
            self.hang.wait(10)
        if self.reads_database:
            GatewayProcess.objects.exists()
            self.inspect_connections.append(connections["default"])
        if self.inspect_error is not None:
            raise self.inspect_error
        return Inspection(self.status)

    def destroy(self, lease_id, profile):
        if self.destroy_error is not None:
            raise self.destroy_error
        self.destroyed.append(lease_id)


@pytest.fixture
def scripted():
    provider = ScriptedProvider()
    providers.register(provider)
    yield provider
    providers.unregister(provider.id)


def on_scripted(session: Session, environment_id: str = ENV) -> Placement:
    """An active placement owning an environment of the scripted provider."""
    placement = dispatch_to_active_on(session, environment_id)
    WorkerEnvironment.objects.filter(pk=environment_id).update(provider_id="scripted")
    return placement


def row(session: Session) -> dict:
    return Placement.objects.values().get(pk=session.pk)


def history_count() -> int:
    return PlacementHistory.objects.count()


def test_an_unknown_lease_fails_the_environment_and_its_placement_once(scripted):
    scripted.status = "unknown"
    session = make_session()
    on_scripted(session)

    workers_recovery_sweep()

    environment = WorkerEnvironment.objects.get(pk=ENV)
    assert (environment.state, environment.lease_id, environment.teardown_terminal_state) == ("failed", None, "failed")
    assert environment.last_error == LOST and environment.destroy_requested_at_ms is not None
    assert environment.attached_session_ids == []
    placement = row(session)
    assert placement["state"] == "failed"
    assert placement["terminal_reason"] == f"cloud worker disappeared: {LOST}"
    assert placement["environment_id"] == ENV  # provenance kept


def test_an_orphaned_environment_keeps_its_state_and_error_and_fails_its_placement():
    session = make_session()
    dispatch_to_active(session)
    WorkerEnvironment.objects.filter(pk=ENV).update(
        state="orphaned", last_error="machine gone", attached_session_ids=[]
    )

    workers_recover_startup()

    environment = WorkerEnvironment.objects.get(pk=ENV)
    assert (environment.state, environment.last_error) == ("orphaned", "machine gone")
    assert row(session)["terminal_reason"] == "cloud worker disappeared: machine gone"


def test_a_missing_environment_record_is_a_disappearance():
    session = make_session()
    dispatch_to_active(session)
    WorkerEnvironment.objects.filter(pk=ENV).delete()

    workers_recovery_sweep()

    assert row(session)["terminal_reason"] == "cloud worker disappeared: environment record missing"


def test_a_healthy_placement_is_never_touched_and_a_neighbour_keeps_its_own_reason(scripted):
    healthy = make_session("agent:main:healthy")
    on_scripted(healthy)
    neighbour = make_session("agent:main:neighbour")
    placement = walk(neighbour, DISPATCH_STEPS[:1])
    store.placement_fail(
        session=neighbour, recovery_error="independent session failure", expected_generation=placement.generation
    )
    before = (row(healthy), row(neighbour), history_count())

    report = workers_recovery_sweep()
    workers_recover_startup()

    assert (row(healthy), row(neighbour), history_count()) == before
    assert report.outcomes["placement:healthy"] == 1


def test_terminal_facts_are_byte_identical_after_repeated_recoveries():
    lost = make_session("agent:main:lost")
    dispatch_to_active(lost)
    WorkerEnvironment.objects.filter(pk=ENV).update(state="orphaned", last_error="gone", attached_session_ids=[])
    workers_recover_startup()
    first = row(lost)
    history = history_count()

    for _ in range(3):
        workers_recover_startup()
        workers_recovery_sweep()

    assert row(lost) == first and history_count() == history


@pytest.mark.parametrize("steps", [0, 1], ids=["requested", "provisioning"])
def test_a_dispatch_whose_gateway_died_fails_as_interrupted(steps):
    session = make_session()
    dead = f"gateway:{uuid.uuid4()}"
    placement = store.placement_start_dispatch(session=session, owner=dead)
    if steps:
        envs.environment_request(
            environment_id=ENV,
            profile=WorkerProfile(id="dev", provider_id="static-ssh"),
            operation_id="op",
        )
        placement = store.placement_transition(
            session=session,
            from_state="requested",
            to_state="provisioning",
            expected_generation=placement.generation,
            patch={"environment_id": ENV},
        )
    state = placement.state

    workers_recover_startup()

    failed = row(session)
    assert failed["state"] == "failed"
    assert failed["terminal_reason"] == f"Worker dispatch interrupted in {state}"
    if steps:
        assert WorkerEnvironment.objects.get(pk=ENV).state == "failed"  # its unleased environment too


def test_a_dispatch_driven_by_a_live_gateway_is_left_alone():
    live = GatewayProcess.objects.create(
        boot_id=uuid.uuid4(), hostname="elsewhere", pid=1, started_at=timezone.now(), heartbeat_at=timezone.now()
    )
    session = make_session()
    store.placement_start_dispatch(session=session, owner=f"gateway:{live.boot_id}")
    before = row(session)

    report = workers_recovery_sweep()

    assert row(session) == before and report.outcomes["placement:in-flight"] == 1


def test_a_provider_that_raises_during_inspect_changes_nothing_but_last_error(scripted):
    scripted.inspect_error = WorkerProviderError("api.example: 503 Service Unavailable")
    session = make_session()
    on_scripted(session)
    placement_before = row(session)
    environment_before = WorkerEnvironment.objects.values().get(pk=ENV)

    workers_recovery_sweep()

    environment = WorkerEnvironment.objects.values().get(pk=ENV)
    assert environment["last_error"] == "inspect: api.example: 503 Service Unavailable"
    unchanged = {k: v for k, v in environment.items() if k not in ("last_error", "updated_at_ms")}
    assert unchanged == {k: v for k, v in environment_before.items() if k not in ("last_error", "updated_at_ms")}
    assert row(session) == placement_before


def test_a_provider_that_hangs_costs_its_deadline_and_changes_nothing(scripted, settings):
    settings.OPENCLAW_WORKERS = {**settings.OPENCLAW_WORKERS, "PROVIDER_TIMEOUT_MS": 200}
    scripted.hang = threading.Event()
    session = make_session()
    on_scripted(session)
    placement_before = row(session)
    try:
        workers_recovery_sweep()
    finally:
        scripted.hang.set()

    environment = WorkerEnvironment.objects.get(pk=ENV)
    assert environment.last_error == "inspect: Worker provider scripted inspect timed out after 200 ms"
    assert environment.state == "attached" and row(session) == placement_before


def test_a_provider_that_reads_the_database_gives_its_connection_back_to_the_pool(scripted):
    if connection.vendor != "postgresql":
        pytest.skip("the connection pool is PostgreSQL's (SQLite keeps a thread's connection for CONN_MAX_AGE)")
    scripted.reads_database = True
    session = make_session()
    on_scripted(session)

    workers_recovery_sweep()

    # Provider calls run on threads that live as long as the process: a connection kept there is one the
    # pool never gets back, and a session that blocks dropping the database.
    [used] = scripted.inspect_connections
    assert used.connection is None


def test_a_provider_bug_reaches_last_error_as_its_kind_not_its_text(scripted):
    scripted.inspect_error = RuntimeError("password=hunter2 at 10.0.0.5")
    session = make_session()
    on_scripted(session)

    workers_recovery_sweep()

    error = WorkerEnvironment.objects.get(pk=ENV).last_error
    assert error == "inspect: Worker provider scripted inspect failed: RuntimeError"


def test_a_failed_teardown_is_retried_without_rewriting_terminal_facts(scripted):
    scripted.status = "destroyed"
    scripted.destroy_error = WorkerProviderError("destroy API down")
    session = make_session()
    on_scripted(session)

    workers_recovery_sweep()
    failed = row(session)
    environment = WorkerEnvironment.objects.get(pk=ENV)
    assert environment.state == "attached" and environment.destroy_requested_at_ms is not None
    assert environment.last_error == (
        "Worker environment disappeared before teardown was requested; environment destroy: destroy API down"
    )
    assert failed["state"] == "failed"
    assert failed["terminal_reason"].startswith(
        "cloud worker disappeared: Worker environment disappeared before teardown was requested"
    )

    workers_recovery_sweep()  # still failing: the recovery error says so, the terminal facts do not change
    again = row(session)
    assert again["recovery_error"] == f"{failed['terminal_reason']}; environment destroy: destroy API down"
    assert (again["terminal_reason"], again["terminal_at_ms"], again["generation"]) == (
        failed["terminal_reason"],
        failed["terminal_at_ms"],
        failed["generation"],
    )

    scripted.destroy_error = None
    workers_recovery_sweep()
    environment = WorkerEnvironment.objects.get(pk=ENV)
    assert (environment.state, environment.lease_id) == ("failed", None)
    assert scripted.destroyed and row(session)["terminal_reason"] == failed["terminal_reason"]


def test_an_active_turn_claim_cannot_survive_a_gateway_restart():
    session = make_session()
    placement = dispatch_to_active(session)
    store.placement_claim_turn(
        session=session,
        owner="worker",
        claim_id="c1",
        run_id="r1",
        expected_generation=placement.generation,
        owner_epoch=1,
    )

    workers_recover_startup()

    failed = row(session)
    assert failed["terminal_reason"] == "Active worker turn claim cannot be proven live after gateway restart"
    assert failed["turn_claim_owner"] is None


def test_a_dispatch_with_no_recorded_driver_is_interrupted_at_start_but_waits_out_a_sweep():
    session = make_session()
    store.placement_start_dispatch(session=session)  # a predecessor's row: no driver recorded
    before = row(session)

    workers_recovery_sweep()
    assert row(session) == before

    workers_recover_startup()
    assert row(session)["terminal_reason"] == "Worker dispatch interrupted in requested"
