"""The placement store: legal edges only, compare-and-set on (state, generation), shape rules in the
database, first terminal facts win, history of every change (workers.md §1)."""

from __future__ import annotations

import itertools
import threading

import pytest
from django.db import IntegrityError, connection, connections, transaction

from gateway.exceptions import Conflict, InvalidRequest
from sessions_app.models import Session
from sessions_app.services.sessions import SessionSpec, session_create
from workers_app.models import TRANSITIONS, Placement, PlacementHistory, PlacementState, WorkerEnvironment
from workers_app.services import placements as store

pytestmark = pytest.mark.django_db

S = PlacementState
BUNDLE = "a" * 64
MANIFEST = "sha256:" + "b" * 64
ENV = "worker:test-env"


def make_session(key: str = "agent:main:placed") -> Session:
    return session_create(spec=SessionSpec(key=key, agent_id="main"))


def attached_environment(
    session: Session, *, epoch: int = 1, environment_id: str = ENV, lease_id: str | None = None
) -> WorkerEnvironment:
    return WorkerEnvironment.objects.create(
        environment_id=environment_id,
        provider_id="static-ssh",
        profile_id="test",
        state="attached",
        lease_id=lease_id or f"static-ssh:{environment_id}",
        owner_epoch=epoch,
        attached_session_ids=[session.session_id],
        workspace_session_id=session.session_id,  # as the attach records it
        created_at_ms=1,
        updated_at_ms=1,
        state_changed_at_ms=1,
    )


DISPATCH_STEPS = [
    (S.REQUESTED, S.PROVISIONING, {"environment_id": ENV}),
    (S.PROVISIONING, S.SYNCING, {"worker_bundle_hash": BUNDLE}),
    (S.SYNCING, S.STARTING, {"workspace_base_manifest_ref": MANIFEST, "remote_workspace_dir": "/work/s"}),
    (S.STARTING, S.ACTIVE, {"active_owner_epoch": 1}),
]


def dispatch_to_active(session: Session) -> Placement:
    attached_environment(session)
    return walk(session, DISPATCH_STEPS)


def dispatch_to_active_on(session: Session, environment_id: str) -> Placement:
    """``dispatch_to_active`` on an environment of another id."""
    attached_environment(session, environment_id=environment_id)
    steps = [
        (a, b, {**patch, "environment_id": environment_id} if a == S.REQUESTED else patch)
        for a, b, patch in DISPATCH_STEPS
    ]
    return walk(session, steps)


def walk(session: Session, steps) -> Placement:
    """Start a dispatch and take these steps, each at the placement's current generation."""
    placement = store.placement_start_dispatch(session=session)
    for from_state, to_state, patch in steps:
        placement = store.placement_transition(
            session=session,
            from_state=from_state,
            to_state=to_state,
            expected_generation=placement.generation,
            patch=patch,
        )
    return placement


def snapshot(session: Session) -> dict:
    return Placement.objects.filter(pk=session.pk).values().first()


def test_a_first_dispatch_walks_one_generation_per_step_and_records_each():
    session = make_session()
    placement = dispatch_to_active(session)

    assert (placement.state, placement.generation) == (S.ACTIVE, 5)
    stored = Placement.objects.get(pk=session.pk)
    assert (stored.environment_id, stored.active_owner_epoch, stored.worker_bundle_hash) == (ENV, 1, BUNDLE)
    history = list(PlacementHistory.objects.filter(session=session).values_list("from_state", "to_state", "generation"))
    assert history == [
        ("", "local", 0),
        ("local", "requested", 1),
        ("requested", "provisioning", 2),
        ("provisioning", "syncing", 3),
        ("syncing", "starting", 4),
        ("starting", "active", 5),
    ]
    assert WorkerEnvironment.objects.get(pk=ENV).last_activated_at_ms is not None


ILLEGAL = [
    (from_state, to_state)
    for from_state, to_state in itertools.product(S.values, S.values)
    if to_state not in TRANSITIONS[from_state] and to_state != S.FAILED
]


@pytest.mark.parametrize(("from_state", "to_state"), ILLEGAL)
def test_an_illegal_edge_is_refused_and_changes_nothing(from_state, to_state):
    session = make_session()
    store.placement_ensure_local(session=session)
    before = snapshot(session)
    with pytest.raises(InvalidRequest) as refused:
        store.placement_transition(session=session, from_state=from_state, to_state=to_state, expected_generation=0)
    assert refused.value.message == f"Illegal worker session placement transition: {from_state} -> {to_state}"
    assert snapshot(session) == before


def test_failed_and_reconciling_have_their_own_operations():
    session = make_session()
    store.placement_ensure_local(session=session)
    with pytest.raises(InvalidRequest, match=r"^Use fail to record terminal worker placement diagnostics$"):
        store.placement_transition(session=session, from_state=S.LOCAL, to_state=S.FAILED, expected_generation=0)
    with pytest.raises(InvalidRequest, match=r"^Use startReconcile after fencing the drained worker environment$"):
        store.placement_transition(
            session=session, from_state=S.DRAINING, to_state=S.RECONCILING, expected_generation=0
        )


def test_a_stale_writer_gets_the_exact_error_and_changes_nothing():
    session = make_session()
    store.placement_start_dispatch(session=session)
    before = snapshot(session)
    with pytest.raises(Conflict) as stale:
        store.placement_transition(
            session=session,
            from_state=S.REQUESTED,
            to_state=S.PROVISIONING,
            expected_generation=0,
            patch={"environment_id": ENV},
        )
    assert stale.value.message == (
        f"Worker session placement {session.session_id} changed: expected requested@0, found requested@1"
    )
    with pytest.raises(Conflict, match=r"expected local@0, found requested@1$"):
        store.placement_transition(session=session, from_state=S.LOCAL, to_state=S.REQUESTED, expected_generation=0)
    assert snapshot(session) == before


def test_a_state_without_its_worker_facts_is_refused():
    session = make_session()
    store.placement_start_dispatch(session=session)
    store.placement_transition(
        session=session,
        from_state=S.REQUESTED,
        to_state=S.PROVISIONING,
        expected_generation=1,
        patch={"environment_id": ENV},
    )
    before = snapshot(session)
    with pytest.raises(InvalidRequest, match=r"cannot be syncing without its worker facts"):
        store.placement_transition(
            session=session, from_state=S.PROVISIONING, to_state=S.SYNCING, expected_generation=2
        )
    assert snapshot(session) == before


def test_activation_needs_the_environment_attached_to_this_session_with_the_same_epoch():
    session = make_session()
    other = make_session("agent:main:other")
    attached_environment(other, lease_id="static-ssh:x")  # attached, but to another session
    walk(session, DISPATCH_STEPS[:3])
    before = snapshot(session)
    with pytest.raises(
        Conflict, match=rf"^Worker session placement {session.session_id} lost its attached environment$"
    ):
        store.placement_transition(
            session=session,
            from_state=S.STARTING,
            to_state=S.ACTIVE,
            expected_generation=4,
            patch={"active_owner_epoch": 1},
        )
    assert snapshot(session) == before
    assert PlacementHistory.objects.filter(session=session, to_state=S.ACTIVE).count() == 0


def test_the_first_failure_wins_and_a_repeat_changes_only_the_recovery_error():
    session = make_session()
    store.placement_start_dispatch(session=session)
    long_reason = "cloud worker disappeared: " + "x" * 3000
    failed = store.placement_fail(session=session, recovery_error=long_reason, expected_generation=1)
    first = snapshot(session)
    again = store.placement_fail(session=session, recovery_error="a later, different failure")

    assert (failed.state, failed.generation) == (S.FAILED, 2)
    assert len(first["terminal_reason"]) == 1024 and first["terminal_reason"].startswith("cloud worker disappeared:")
    assert first["recovery_error"] == first["terminal_reason"]
    assert again.recovery_error == "a later, different failure"
    after = snapshot(session)
    assert (after["terminal_reason"], after["terminal_at_ms"], after["generation"]) == (
        first["terminal_reason"],
        first["terminal_at_ms"],
        first["generation"],
    )


def test_an_active_placement_cannot_fail_directly_and_a_stale_failure_is_refused():
    session = make_session()
    placement = dispatch_to_active(session)
    with pytest.raises(InvalidRequest, match=r"^Cannot fail worker session placement from active$"):
        store.placement_fail(session=session, recovery_error="boom")
    with pytest.raises(Conflict, match=rf"^Worker session placement {session.session_id} changed before failure$"):
        store.placement_fail(session=session, recovery_error="boom", expected_generation=placement.generation - 1)
    assert Placement.objects.get(pk=session.pk).state == S.ACTIVE


def test_drain_and_reconcile_only_for_the_exact_owner():
    session = make_session()
    placement = dispatch_to_active(session)
    for wrong in ({"environment_id": "worker:other"}, {"owner_epoch": 2}, {"expected_generation": 4}):
        arguments = {"environment_id": ENV, "owner_epoch": 1, "expected_generation": placement.generation, **wrong}
        with pytest.raises(Conflict, match=rf"^Cannot drain stale worker placement for session {session.session_id}$"):
            store.placement_start_drain(session=session, **arguments)
    drained = store.placement_start_drain(
        session=session, environment_id=ENV, owner_epoch=1, expected_generation=placement.generation
    )
    with pytest.raises(Conflict, match=r"^Cannot reconcile stale worker placement"):
        store.placement_start_reconcile(session=session, environment_id=ENV, owner_epoch=2, expected_generation=6)
    reconciling = store.placement_start_reconcile(
        session=session, environment_id=ENV, owner_epoch=1, expected_generation=drained.generation
    )
    back = store.placement_transition(
        session=session, from_state=S.RECONCILING, to_state=S.LOCAL, expected_generation=reconciling.generation
    )
    assert (drained.state, reconciling.state, back.state, back.generation) == (S.DRAINING, S.RECONCILING, S.LOCAL, 8)
    assert snapshot(session)["environment_id"] is None  # back on the gateway: no worker facts


def test_reclaimed_keeps_its_time_but_no_reason_and_may_be_dispatched_again():
    session = make_session()
    dispatch_to_active(session)
    store.placement_start_drain(session=session, environment_id=ENV, owner_epoch=1, expected_generation=5)
    store.placement_start_reconcile(session=session, environment_id=ENV, owner_epoch=1, expected_generation=6)
    reclaimed = store.placement_transition(
        session=session, from_state=S.RECONCILING, to_state=S.RECLAIMED, expected_generation=7
    )
    assert reclaimed.terminal_at_ms is not None and reclaimed.terminal_reason is None
    again = store.placement_start_dispatch(session=session)
    assert (again.state, again.terminal_at_ms, again.environment_id) == (S.REQUESTED, None, None)


def test_dispatch_is_refused_while_a_placement_is_in_flight():
    session = make_session()
    store.placement_start_dispatch(session=session)
    with pytest.raises(
        InvalidRequest, match=rf"^Cannot dispatch session {session.session_id} from placement requested$"
    ):
        store.placement_start_dispatch(session=session)


def test_retirement_needs_the_exact_state_and_generation():
    session = make_session()
    store.placement_start_dispatch(session=session)
    with pytest.raises(Conflict, match=r"changed before retirement$"):
        store.placement_retire(session=session, expected_state=S.REQUESTED, expected_generation=0)
    store.placement_retire(session=session, expected_state=S.REQUESTED, expected_generation=1)
    assert not Placement.objects.filter(pk=session.pk).exists()
    assert PlacementHistory.objects.filter(session=session).last().to_state == "retired"


def test_turn_claims_follow_the_shape_rules():
    session = make_session()
    placement = store.placement_ensure_local(session=session)
    store.placement_claim_turn(session=session, owner="local", claim_id="c1", run_id="r1", expected_generation=0)
    with pytest.raises(Conflict, match=r"already has an active turn$"):
        store.placement_claim_turn(session=session, owner="local", claim_id="c2", run_id="r2", expected_generation=0)
    assert store.placement_release_turn(session=session, claim_id="c1") is True
    assert store.placement_release_turn(session=session, claim_id="c1") is False

    active_session = make_session("agent:main:active")
    active = dispatch_to_active(active_session)
    with pytest.raises(
        InvalidRequest, match=r"^Local turn claim requires local, dispatch-barrier, or failed placement$"
    ):
        store.placement_claim_turn(
            session=active_session, owner="local", claim_id="c3", run_id="r3", expected_generation=active.generation
        )
    with pytest.raises(InvalidRequest, match=r"^Worker turn claim requires the active or draining worker owner epoch$"):
        store.placement_claim_turn(
            session=active_session,
            owner="worker",
            claim_id="c4",
            run_id="r4",
            expected_generation=active.generation,
            owner_epoch=2,
        )
    claimed = store.placement_claim_turn(
        session=active_session,
        owner="worker",
        claim_id="c5",
        run_id="r5",
        expected_generation=active.generation,
        owner_epoch=1,
    )
    assert claimed.turn_claim_id == "c5"
    assert placement.state == S.LOCAL


def test_recovery_errors_are_redacted_and_collapsed():
    bounded = store.bounded_worker_error(
        "ssh failed:\n\n  Authorization: Bearer abc.def  token=s3cr3t sk-ABCDEFGHIJKL end"
    )
    assert bounded == "ssh failed: Authorization: Bearer *** token=*** sk-*** end"
    assert len(store.bounded_worker_error("𝄞" * 2000).encode("utf-16-le")) == 2048


SHAPE_VIOLATIONS = [
    ("local with an environment", {"state": "local", "environment_id": ENV}),
    ("syncing without a bundle", {"state": "syncing", "environment_id": ENV}),
    (
        "active without an epoch",
        {
            "state": "active",
            "environment_id": ENV,
            "worker_bundle_hash": BUNDLE,
            "workspace_base_manifest_ref": MANIFEST,
            "remote_workspace_dir": "/w",
        },
    ),
    ("failed without a recovery error", {"state": "failed"}),
    ("a reason outside failed", {"state": "requested", "terminal_reason": "x"}),
    ("a terminal time in local", {"state": "local", "terminal_at_ms": 1}),
    ("an unknown state", {"state": "stopping"}),
    ("a negative generation", {"generation": -1}),
    (
        "an epoch of zero",
        {
            "state": "active",
            "environment_id": ENV,
            "worker_bundle_hash": BUNDLE,
            "workspace_base_manifest_ref": MANIFEST,
            "remote_workspace_dir": "/w",
            "active_owner_epoch": 0,
        },
    ),
    ("half a turn claim", {"turn_claim_owner": "local", "turn_claim_id": "c"}),
    ("an oversized recovery error", {"state": "failed", "recovery_error": "x" * 1025}),
]


@pytest.mark.parametrize(("label", "changes"), SHAPE_VIOLATIONS, ids=[v[0] for v in SHAPE_VIOLATIONS])
def test_the_database_refuses_every_shape_violation(label, changes):
    session = make_session()
    store.placement_ensure_local(session=session)
    with pytest.raises(IntegrityError), transaction.atomic():
        Placement.objects.filter(pk=session.pk).update(**changes)
    assert snapshot(session)["state"] == S.LOCAL


def test_environments_hold_a_lease_exactly_in_the_leased_states():
    base = {
        "provider_id": "static-ssh",
        "profile_id": "p",
        "created_at_ms": 1,
        "updated_at_ms": 1,
        "state_changed_at_ms": 1,
    }
    for environment_id, state, lease in (("e1", "orphaned", None), ("e2", "requested", "static-ssh:x")):
        with pytest.raises(IntegrityError), transaction.atomic():
            WorkerEnvironment.objects.create(environment_id=environment_id, state=state, lease_id=lease, **base)
    WorkerEnvironment.objects.create(environment_id="e3", state="orphaned", lease_id="static-ssh:", **base)
    with pytest.raises(IntegrityError), transaction.atomic():
        WorkerEnvironment.objects.create(environment_id="e4", state="attached", lease_id="static-ssh:", **base)


@pytest.mark.django_db(transaction=True)
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # a writer that died fails it
def test_sixteen_concurrent_writers_lose_no_update():
    if connection.vendor != "postgresql":
        pytest.skip("the contended compare-and-set is measured on PostgreSQL (SQLite serializes writers)")
    session = make_session("agent:main:contended")
    store.placement_ensure_local(session=session)
    target, writers = 1000, 16
    successes: list[int] = []
    stale: list[str] = []
    lock = threading.Lock()
    # A legal cycle with no worker facts: local -> requested -> failed -> local.
    next_step = {S.LOCAL: S.REQUESTED, S.REQUESTED: S.FAILED, S.FAILED: S.LOCAL}

    def writer() -> None:
        try:
            while True:
                with lock:
                    if len(successes) >= target:
                        return
                current = Placement.objects.values_list("state", "generation").get(pk=session.pk)
                state, generation = current
                try:
                    if next_step[state] == S.FAILED:
                        moved = store.placement_fail(
                            session=session, recovery_error="cycle", expected_generation=generation
                        )
                    else:
                        moved = store.placement_transition(
                            session=session, from_state=state, to_state=next_step[state], expected_generation=generation
                        )
                except (Conflict, InvalidRequest) as error:
                    with lock:
                        stale.append(error.message)
                    continue
                finally:
                    # Back to the pool after every attempt, as a request would: the 16 writers share
                    # the process's pooled connections (OPENCLAW_DB_POOL_MAX_SIZE) instead of queueing.
                    connections.close_all()
                with lock:
                    successes.append(moved.generation)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)

    final = Placement.objects.get(pk=session.pk)
    assert len(successes) >= target
    assert len(set(successes)) == len(successes)  # every success got its own generation
    assert final.generation == len(successes)  # and none was lost
    allowed = (
        f"Worker session placement {session.session_id} changed",
        f"Worker session placement {session.session_id} changed before failure",
        f"Worker session placement {session.session_id} changed during transition",
        "Cannot fail worker session placement from",
    )
    assert stale and all(message.startswith(allowed) for message in stale), set(stale)
    assert PlacementHistory.objects.filter(session=session).count() == len(successes) + 1


def test_failing_an_owned_placement_walks_the_remaining_edges_in_one_write():
    session = make_session()
    placement = dispatch_to_active(session)
    store.placement_claim_turn(
        session=session,
        owner="worker",
        claim_id="c",
        run_id="r",
        expected_generation=placement.generation,
        owner_epoch=1,
    )

    failed = store.placement_fail_owned(
        session=session,
        environment_id=ENV,
        owner_epoch=1,
        expected_generation=placement.generation,
        recovery_error="gone",
    )

    assert (failed.state, failed.generation, failed.terminal_reason, failed.turn_claim_owner) == (
        S.FAILED,
        8,
        "gone",
        None,
    )
    rows = list(PlacementHistory.objects.filter(session=session).order_by("-id")[:3])[::-1]
    assert [(r.from_state, r.to_state, r.generation) for r in rows] == [
        (S.ACTIVE, S.DRAINING, 6),
        (S.DRAINING, S.RECONCILING, 7),
        (S.RECONCILING, S.FAILED, 8),
    ]
    assert snapshot(session)["generation"] == 8


@pytest.mark.parametrize(("environment_id", "epoch", "generation"), [("worker:other", 1, 5), (ENV, 2, 5), (ENV, 1, 4)])
def test_failing_an_owned_placement_refuses_a_stale_owner_and_changes_nothing(environment_id, epoch, generation):
    session = make_session()
    dispatch_to_active(session)
    before, history = snapshot(session), PlacementHistory.objects.count()

    with pytest.raises(Conflict, match="Cannot reconcile stale worker placement for session"):
        store.placement_fail_owned(
            session=session,
            environment_id=environment_id,
            owner_epoch=epoch,
            expected_generation=generation,
            recovery_error="gone",
        )

    assert (snapshot(session), PlacementHistory.objects.count()) == (before, history)
