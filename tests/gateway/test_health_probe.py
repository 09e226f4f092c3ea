"""The ``health`` probe: on a thread of its own, refreshed in the background, waited for only when it is old."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from channels.db import database_sync_to_async
from django.db import OperationalError

from gateway import health

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def probed(monkeypatch):
    """A probe taken ``age`` seconds ago (the cache's state is put back after the test)."""
    monkeypatch.setattr(health, "probe_cache", health.HealthCache())

    def at_age(age: float) -> dict:
        snapshot = health.probe_database()
        health.probe_cache.snapshot, health.probe_cache.probed_at = snapshot, time.monotonic() - age
        return snapshot

    return at_age


def test_the_probe_does_not_wait_behind_the_request_thread(probed):
    release = threading.Event()

    async def scenario() -> tuple[dict, bool]:
        # Every request's database work goes through this one thread; keep it busy.
        busy = asyncio.ensure_future(database_sync_to_async(release.wait)(30))
        try:
            await asyncio.sleep(0.05)
            snapshot = await asyncio.wait_for(health.health_snapshot(), 10)
            return snapshot, busy.done()
        finally:
            release.set()
            await busy

    snapshot, request_thread_was_free = asyncio.run(scenario())
    assert snapshot["ok"] is True and snapshot["database"]["ok"] is True
    assert not request_thread_was_free


def test_a_stale_probe_is_answered_at_once_and_refreshed_behind_it(probed):
    old = probed(health.HEALTH_MAX_AGE_S + 1)
    release = threading.Event()
    health.probe_pool.submit(release.wait, 30)  # the probe's thread is busy: the refresh queues

    async def scenario() -> tuple[dict, dict, dict]:
        answered = await asyncio.wait_for(health.health_snapshot(), 10)
        again = await asyncio.wait_for(health.health_snapshot(), 10)  # the same refresh, not a second one
        release.set()
        refreshed = await asyncio.wait_for(health.probe_cache.refresh, 10)
        return answered, again, refreshed

    answered, again, refreshed = asyncio.run(scenario())
    assert answered is old and again is old
    assert refreshed is health.last_health() and refreshed is not old
    assert refreshed["probedAtMs"] >= old["probedAtMs"]


def test_a_probe_too_old_to_stand_for_the_database_is_waited_for(probed):
    old = probed(health.HEALTH_WAIT_AGE_S + 1)
    fresh = asyncio.run(asyncio.wait_for(health.health_snapshot(), 10))
    assert fresh is not old and fresh is health.last_health()


def test_a_failed_probe_reaches_the_caller_that_waits_and_is_tried_again(probed, monkeypatch):
    probed(health.HEALTH_WAIT_AGE_S + 1)
    real_probe = health.probe_database

    def database_down() -> dict:
        raise OperationalError("connection refused")

    monkeypatch.setattr(health, "probe_database", database_down)
    with pytest.raises(OperationalError):
        asyncio.run(health.health_snapshot())
    monkeypatch.setattr(health, "probe_database", real_probe)
    assert asyncio.run(health.health_snapshot())["ok"] is True
