"""The Celery tasks guard on state first: a duplicate, stale or redelivered task changes nothing."""

from __future__ import annotations

import pytest

from workers_app import tasks
from workers_app.models import Placement, PlacementHistory
from workers_app.services import placements as store

from .test_placement_store import DISPATCH_STEPS, make_session, walk

pytestmark = pytest.mark.django_db


def test_a_dispatch_task_for_an_older_generation_changes_nothing():
    session = make_session()
    placement = walk(session, DISPATCH_STEPS[:1])
    before = (Placement.objects.values().get(pk=session.pk), PlacementHistory.objects.count())

    assert tasks.dispatch_advance.run(session.pk, placement.generation - 1) == "stale"
    assert tasks.dispatch_advance.run(session.pk + 1000, placement.generation) == "stale"

    assert (Placement.objects.values().get(pk=session.pk), PlacementHistory.objects.count()) == before


def test_a_dispatch_task_that_arrives_after_its_dispatch_ended_changes_nothing():
    session = make_session()
    placement = walk(session, DISPATCH_STEPS[:1])
    failed = store.placement_fail(session=session, recovery_error="canceled", expected_generation=placement.generation)
    before = (Placement.objects.values().get(pk=session.pk), PlacementHistory.objects.count())

    assert tasks.dispatch_advance.run(session.pk, failed.generation) == "failed"

    assert (Placement.objects.values().get(pk=session.pk), PlacementHistory.objects.count()) == before


def test_the_sweep_task_reports_what_it_saw():
    session = make_session()
    walk(session, DISPATCH_STEPS[:1])
    assert tasks.recovery_sweep.run()["placementsSeen"] == 1
