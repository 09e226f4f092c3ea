"""Shared counters: raised by one atomically, missing ones start at zero, readable with ``cache.get``."""

from __future__ import annotations

import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.core.cache import cache

from gateway import counters


def _key() -> str:
    return f"test:counter:{uuid.uuid4()}"


def test_a_missing_counter_starts_at_one_and_rises_by_one():
    key = _key()
    assert counters.bump(key) == 1
    assert counters.bump(key) == 2
    assert cache.get(key) == 2


def test_bump_and_read_returns_the_other_counters_zero_when_unset():
    key, other, unset = _key(), _key(), _key()
    counters.bump(other)
    counters.bump(other)
    assert counters.bump_and_read(key, other, unset) == (1, 2, 0)
    assert counters.bump_and_read(key, other) == (2, 2)


def test_a_counter_set_through_the_cache_keeps_counting():
    key = _key()
    cache.set(key, 41, timeout=None)
    assert counters.bump(key) == 42
    cache.delete(key)  # evicted: starts over
    assert counters.bump(key) == 1


@pytest.fixture
def frequent_thread_switches():
    """Threads switch every few bytecodes, so that a read-modify-write that is not atomic shows it."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def test_concurrent_bumps_of_a_new_counter_are_all_counted_each_once(frequent_thread_switches):
    key, threads, bumps = _key(), 16, 50
    start = threading.Barrier(threads)

    def bump_many() -> list[int]:
        start.wait()  # every thread meets the missing counter at once
        return [counters.bump(key) for _ in range(bumps)]

    with ThreadPoolExecutor(threads) as pool:
        seen = [value for values in pool.map(lambda _: bump_many(), range(threads)) for value in values]
    assert sorted(seen) == list(range(1, threads * bumps + 1))
    assert cache.get(key) == threads * bumps
