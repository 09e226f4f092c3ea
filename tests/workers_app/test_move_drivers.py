"""One driver per placement operation (issue 27).

A move's intent names the call driving it: an identical request made meanwhile joins it — it changes nothing and
answers the driver's outcome — and a claim whose driver is gone (its process, its call, or its silence past the
stage deadline) is taken over. A move left behind by an operation that took its placement on never blocks the next
move. Identical dispatches racing for the barrier join the one that took it. Concurrent teardowns of one
environment share one provider call and end it once; the caller of a provider waits without a database connection.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.utils import timezone

from gateway.background import executor_label
from gateway.exceptions import Conflict, InvalidRequest, Unavailable
from gateway.models import GatewayProcess
from sessions_app.models import Session
from workers_app import operations
from workers_app.models import Placement, PlacementHistory, PlacementMove, PlacementState, WorkerEnvironment
from workers_app.providers import WorkerProviderError, providers
from workers_app.schemas import MoveRequest
from workers_app.services import dispatch as dispatch_service
from workers_app.services import placements as store
from workers_app.services.placements import Actor, now_ms
from workers_app.services.recovery import workers_recover_startup
from workers_app.services.teardown import call_provider, teardown_environment

from .test_placement_store import ENV, dispatch_to_active, dispatch_to_active_on, make_session
from .test_rpc import dev_profile, drain, move, start_reconcile, use_profiles, world  # noqa: F401  (fixtures by name)

pytestmark = pytest.mark.django_db(transaction=True)

S = PlacementState
ACTOR = Actor("test")
MOVE_FAILED = "Worker move to the gateway failed; retry the move; environment destroy: provider API unreachable"


def live_gateway() -> str:
    process = GatewayProcess.objects.create(
        boot_id=uuid.uuid4(), hostname="elsewhere", pid=1, started_at=timezone.now(), heartbeat_at=timezone.now()
    )
    return f"gateway:{process.boot_id}"


def intent(session: Session, *, driver: str, environment_id: str = ENV, updated_at_ms: int | None = None):
    at = now_ms()
    return PlacementMove.objects.create(
        operation_id=f"move:v1:{uuid.uuid4().hex}",
        session=session,
        source_generation=5,
        source_environment_id=environment_id,
        source_owner_epoch=1,
        target_kind="gateway",
        driver=driver,
        created_at_ms=at,
        updated_at_ms=at if updated_at_ms is None else updated_at_ms,
    )


def move_request(generation: int = 5, environment_id: str = ENV) -> MoveRequest:
    return MoveRequest(
        expected={"generation": generation, "environmentId": environment_id, "ownerEpoch": 1},
        target={"kind": "gateway"},
    )


def requested(session: Session) -> tuple[str, str | None]:
    return operations.move_requested(session=session, request=move_request(), is_admin=True, actor=ACTOR)


def assert_linear(session: Session) -> None:
    rows = list(PlacementHistory.objects.filter(session=session).order_by("pk").values_list("from_state", "generation"))
    states = list(PlacementHistory.objects.filter(session=session).order_by("pk").values_list("to_state", flat=True))
    assert [generation for _, generation in rows] == list(range(len(rows)))
    assert [from_state for from_state, _ in rows] == ["", *states[:-1]]


# --- joining a driven move ---------------------------------------------------------------------------


def test_a_move_another_call_drives_is_joined_and_changes_nothing():
    session = make_session()
    dispatch_to_active(session)
    driver = f"{live_gateway()}/a1b2c3"
    intent(session, driver=driver)
    before = world()

    assert requested(session) == ("gateway", driver)
    assert world() == before


def test_a_joined_call_answers_the_drivers_outcome():
    session = make_session()
    placement = dispatch_to_active(session)
    driver = f"{live_gateway()}/a1b2c3"
    move_intent = intent(session, driver=driver)
    _target, joined = requested(session)
    # The driver finishes: active → draining → reconciling → local, its intent gone with the last step.
    placement = start_reconcile(session, drain(session, placement))
    store.placement_transition(
        session=session, from_state=S.RECONCILING, to_state=S.LOCAL, expected_generation=placement.generation
    )
    move_intent.delete()

    answer = asyncio.run(operations.move_result(session.pk, "gateway", joined))

    assert answer["placement"]["state"] == S.LOCAL


def test_a_joined_call_answers_the_drivers_failure():
    session = make_session()
    dispatch_to_active(session)
    move_intent = intent(session, driver=f"{live_gateway()}/a1b2c3")
    _target, joined = requested(session)
    # The driver's teardown failed: it let the move go with its reason (the same move, retried, resumes it).
    PlacementMove.objects.filter(pk=move_intent.pk).update(driver="", last_error=MOVE_FAILED)

    with pytest.raises(Unavailable) as failed:
        asyncio.run(operations.move_result(session.pk, "gateway", joined))

    assert (failed.value.message, failed.value.details, failed.value.retryable) == (
        MOVE_FAILED,
        {"code": "WORKER_MOVE_FAILED"},
        True,
    )


def test_a_joined_call_answers_the_placement_as_it_stands_when_the_wait_ends(settings):
    settings.OPENCLAW_WORKERS = {**settings.OPENCLAW_WORKERS, "DISPATCH_WAIT_MS": 100}
    session = make_session()
    dispatch_to_active(session)
    intent(session, driver=f"{live_gateway()}/a1b2c3")
    _target, joined = requested(session)

    answer = asyncio.run(operations.move_result(session.pk, "gateway", joined))

    assert answer["placement"]["state"] == S.ACTIVE
    assert PlacementMove.objects.filter(session=session).exists()


# --- taking a claim over -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "claim", ["dead-gateway", "ended-call-of-this-process", "silent-past-the-stage-deadline", "nobody"]
)
def test_a_move_whose_driver_is_gone_is_taken_over_and_finished(claim):
    session = make_session()
    dispatch_to_active(session)
    drivers = {
        "dead-gateway": (f"gateway:{uuid.uuid4()}/a1b2c3", None),
        "ended-call-of-this-process": (f"{executor_label()}/a1b2c3", None),
        "silent-past-the-stage-deadline": (f"{live_gateway()}/a1b2c3", 1),
        "nobody": ("", None),
    }
    driver, updated_at_ms = drivers[claim]
    intent(session, driver=driver, updated_at_ms=updated_at_ms)

    assert move(session)["placement"]["state"] == S.LOCAL
    assert not PlacementMove.objects.exists()
    assert WorkerEnvironment.objects.get(pk=ENV).state == "destroyed"
    assert_linear(session)


def test_a_move_left_behind_on_another_environment_does_not_block_the_next_move():
    session = make_session()
    dispatch_to_active(session)
    intent(session, driver="", environment_id="worker:earlier")

    assert move(session)["placement"]["state"] == S.LOCAL
    assert not PlacementMove.objects.exists()


def test_a_move_on_another_environment_that_a_live_call_drives_is_a_conflict():
    session = make_session()
    dispatch_to_active(session)
    intent(session, driver=f"{live_gateway()}/a1b2c3", environment_id="worker:earlier")
    before = world()

    with pytest.raises(Conflict) as refused:
        move(session)

    assert refused.value.message == f"Session {session.session_id} already has a conflicting placement move"
    assert world() == before


def test_recovery_leaves_a_move_that_a_live_call_drives_alone():
    session = make_session()
    placement = drain(session, dispatch_to_active(session))
    # The placement's own driver mark is a dead gateway's; the intent's claim is a live call's.
    Placement.objects.filter(pk=session.pk).update(dispatch_owner=f"gateway:{uuid.uuid4()}")
    intent(session, driver=f"{live_gateway()}/a1b2c3")
    before = world()

    report = workers_recover_startup()

    assert report.outcomes["placement:in-flight"] == 1
    assert world() == before
    assert Placement.objects.get(pk=session.pk).generation == placement.generation


# --- bursts in threads (PostgreSQL: real row locks and concurrent transactions) ----------------------------


def postgresql_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL's row locks (SQLite serializes every write)")


def in_threads(count: int, fn):
    """``fn()`` from ``count`` threads at once; each result, or the GatewayError it raised."""
    barrier = threading.Barrier(count)

    def one():
        barrier.wait()
        try:
            return fn()
        except (InvalidRequest, Unavailable) as error:
            return error
        finally:
            connection.close()

    with ThreadPoolExecutor(count) as pool:
        return [future.result() for future in [pool.submit(one) for _ in range(count)]]


@pytest.mark.parametrize("writers", [16, 64])
def test_identical_moves_in_threads_have_one_driver(writers):
    postgresql_only()
    session = make_session()
    dispatch_to_active(session)

    results = in_threads(writers, lambda: requested(session))

    drove = [r for r in results if r == ("gateway", None)]
    joined = [r for r in results if isinstance(r, tuple) and r[1] is not None]
    stale = [r for r in results if isinstance(r, Exception)]
    assert len(drove) == 1 and len(drove) + len(joined) + len(stale) == writers
    assert {r.message for r in stale} <= {
        f"Cannot move stale worker placement for session {session.session_id}",
        "session cannot move from placement local",
    }
    assert Placement.objects.get(pk=session.pk).state == S.LOCAL
    assert WorkerEnvironment.objects.get(pk=ENV).state == "destroyed"
    assert not PlacementMove.objects.exists()
    assert_linear(session)


@pytest.mark.parametrize("writers", [16, 64])
def test_identical_dispatches_in_threads_join_the_one_that_took_the_barrier(dev_profile, writers):  # noqa: F811
    postgresql_only()
    session = make_session()

    results = in_threads(
        writers, lambda: dispatch_service.dispatch_start(session=session, target="profile:dev", actor=ACTOR)
    )

    assert [started for _placement, started in results].count(True) == 1
    assert {(placement.state, placement.generation) for placement, _ in results} == {(S.PROVISIONING, 2)}
    assert WorkerEnvironment.objects.count() == 1
    assert_linear(session)


def test_concurrent_teardowns_of_one_environment_share_the_provider_call_and_all_end_clean(monkeypatch):
    postgresql_only()
    session = make_session()
    dispatch_to_active_on(session, "worker:shared")
    provider = providers.get("static-ssh")
    calls: list[str] = []
    release = provider.destroy

    def destroy(lease_id, profile):
        calls.append(lease_id)
        time.sleep(0.3)  # long enough for the other teardowns to find the call under way
        return release(lease_id, profile)

    monkeypatch.setattr(provider, "destroy", destroy)

    results = in_threads(16, lambda: teardown_environment("worker:shared", terminal_state="destroyed"))

    assert results == [[]] * 16  # nobody lost a race it should have joined
    assert WorkerEnvironment.objects.get(pk="worker:shared").state == "destroyed"
    assert 1 <= len(calls) < 16


# --- provider calls ------------------------------------------------------------------------------------


def test_a_provider_call_waits_without_the_callers_connection():
    """The caller holds a connection and other threads hold every other one: the provider's query can only run on
    the caller's, which it gives back before waiting (before, the call timed out on the pool)."""
    postgresql_only()
    connection.ensure_connection()
    holding, done = threading.Barrier(connection.pool.max_size), threading.Event()

    def hold() -> None:
        connection.ensure_connection()
        holding.wait()
        done.wait(30)
        connection.close()

    holders = [threading.Thread(target=hold) for _ in range(connection.pool.max_size - 1)]
    for thread in holders:
        thread.start()
    holding.wait()
    try:
        assert call_provider("test", "inspect", Session.objects.count, key="count") == 0
    finally:
        done.set()
        for thread in holders:
            thread.join()


def test_an_identical_provider_call_joins_the_one_under_way(settings):
    settings.OPENCLAW_WORKERS = {**settings.OPENCLAW_WORKERS, "PROVIDER_TIMEOUT_MS": 200}
    release, finished, calls = threading.Event(), threading.Event(), []

    def destroy(lease_id: str) -> str:
        calls.append(lease_id)
        release.wait(10)
        finished.set()
        return f"released {lease_id}"

    for _ in range(2):
        # The first call's deadline passes while the provider works on; the same destroy asked again meanwhile
        # waits for that one (and here, its deadline passes too) instead of calling the provider again.
        with pytest.raises(WorkerProviderError, match="Worker provider test destroy timed out after 200 ms"):
            call_provider("test", "destroy", destroy, "lease-1", key="lease-1")
    assert calls == ["lease-1"]
    release.set()
    finished.wait(10)
    # Another lease is another call.
    assert call_provider("test", "destroy", destroy, "lease-2", key="lease-2") == "released lease-2"
    assert calls == ["lease-1", "lease-2"]
