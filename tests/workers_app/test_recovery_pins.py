"""Each of the behaviours seed 002's guarantees rest on, pinned on its own (issue 26): a test here fails when that
one behaviour breaks, even while the others still hold."""

from __future__ import annotations

import pytest

from workers_app.models import Placement, PlacementHistory, WorkerEnvironment
from workers_app.services import placements as store
from workers_app.services.recovery import workers_recover_startup

from .test_placement_store import ENV, dispatch_to_active, make_session

pytestmark = pytest.mark.django_db


def lose_worker() -> None:
    WorkerEnvironment.objects.filter(pk=ENV).update(state="orphaned", last_error="gone", attached_session_ids=[])


def test_startup_recovery_does_not_touch_a_placement_that_is_already_failed():
    session = make_session()
    dispatch_to_active(session)
    lose_worker()
    # Failed by someone else first, with a reason of its own; recovery would fail it with another one.
    placement = Placement.objects.get(pk=session.pk)
    store.placement_fail_owned(
        session=session,
        environment_id=ENV,
        owner_epoch=placement.active_owner_epoch,
        expected_generation=placement.generation,
        recovery_error="failed before the restart",
    )
    before = Placement.objects.values().get(pk=session.pk)
    history = PlacementHistory.objects.count()

    report = workers_recover_startup()

    assert report.outcomes["placement:settled"] == 1
    # Not one write: not even the recovery error or the update time (placement_fail's write-once would keep the
    # terminal facts but still write those, and a history row).
    assert Placement.objects.values().get(pk=session.pk) == before
    assert PlacementHistory.objects.count() == history


def test_recovery_failing_an_owned_placement_bumps_its_generation_and_writes_its_history():
    session = make_session()
    active = dispatch_to_active(session)
    lose_worker()
    history = PlacementHistory.objects.count()

    workers_recover_startup()

    failed = Placement.objects.get(pk=session.pk)
    assert failed.state == "failed"
    # active → draining → reconciling → failed: one generation and one history row per edge.
    assert failed.generation == active.generation + 3
    rows = list(PlacementHistory.objects.filter(session=session).order_by("id"))[history:]
    assert [(r.from_state, r.to_state, r.generation) for r in rows] == [
        ("active", "draining", active.generation + 1),
        ("draining", "reconciling", active.generation + 2),
        ("reconciling", "failed", active.generation + 3),
    ]
    assert rows[-1].reason == failed.terminal_reason and failed.terminal_reason.startswith("cloud worker disappeared:")


def test_a_second_failure_keeps_the_terminal_facts_at_the_service_level():
    session = make_session()
    dispatch_to_active(session)
    lose_worker()
    workers_recover_startup()
    first = Placement.objects.get(pk=session.pk)

    again = store.placement_fail(session=session, recovery_error="a later failure")

    assert (again.terminal_reason, again.terminal_at_ms) == (first.terminal_reason, first.terminal_at_ms)
    stored = Placement.objects.get(pk=session.pk)
    assert (stored.terminal_reason, stored.terminal_at_ms, stored.generation) == (
        first.terminal_reason,
        first.terminal_at_ms,
        first.generation,
    )
    assert stored.recovery_error == "a later failure"
