"""Leases of the Celery worker processes (gateway/executor_leases.py): which executors count as stopped, and the
gateway loop's watch turn."""

from __future__ import annotations

import time

from django.core.cache import cache

from gateway import lifecycle
from gateway.executor_leases import HOLDER_KEY, LEASE_KEY, lease_renew, lease_ttl_s, stopped_executors


def test_a_worker_whose_lease_expired_is_stopped_and_nothing_else_is(worker_labels):
    alive, stopped, never_held = worker_labels("alive"), worker_labels("stopped"), worker_labels("never")
    for label in (alive, stopped):
        lease_renew(label)
    # What the expiry does once the process stops renewing (the real expiry is below).
    cache.delete(LEASE_KEY.format(stopped))
    gateway_executor = "gateway:00000000-0000-0000-0000-000000000000"
    assert stopped_executors([alive, stopped, never_held, gateway_executor, stopped]) == {stopped}
    assert stopped_executors([]) == set()


def test_an_emptied_cache_proves_no_worker_stopped(worker_labels):
    label = worker_labels("flushed")
    lease_renew(label)
    cache.delete_many([LEASE_KEY.format(label), HOLDER_KEY.format(label)])
    assert stopped_executors([label]) == set()
    lease_renew(label)  # its next renewal
    assert stopped_executors([label]) == set()


def test_a_lease_nobody_renews_expires(worker_labels, settings):
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "EXECUTOR_LEASE_TTL_MS": 1000}
    label = worker_labels("expiring")
    lease_renew(label)
    assert lease_ttl_s() == 1 and stopped_executors([label]) == set()
    deadline = time.monotonic() + 10
    while not stopped_executors([label]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stopped_executors([label]) == {label}


def test_one_process_runs_the_watches_per_interval(settings):
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "EXECUTOR_WATCH_INTERVAL_MS": 60_000}
    cache.delete(lifecycle.watch_turn_key())
    try:
        assert lifecycle.watch_turn_taken() is True
        # Another process asking within the interval (the same key, whoever asks) is refused.
        assert lifecycle.watch_turn_taken() is False
    finally:
        cache.delete(lifecycle.watch_turn_key())


def test_processes_of_another_turn_queue_take_their_own_watch_turns(settings):
    """Their watches judge their own queue: one of them taking every turn would leave the other's unclaimed turns
    queued for ever (two test gateways sharing a cache, or deployments sharing one Redis prefix)."""
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "EXECUTOR_WATCH_INTERVAL_MS": 60_000}
    keys = []
    try:
        for queue in ("queue-a", "queue-b"):
            settings.CELERY_TASK_DEFAULT_QUEUE = queue
            keys.append(lifecycle.watch_turn_key())
            cache.delete(keys[-1])
            assert lifecycle.watch_turn_taken() is True
            assert lifecycle.watch_turn_taken() is False
    finally:
        cache.delete_many(keys)
