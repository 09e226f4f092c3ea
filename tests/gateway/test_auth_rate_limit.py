"""The brute-force limiter on each cache it runs on: failures at the same moment are all counted,
the window is fixed from its first failure, and the lockout outlasts a success."""

from __future__ import annotations

import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.core.cache import cache

from gateway.auth import AuthRateLimiter

MAX_FAILURES = 10


@pytest.fixture(params=["locmem", "redis"])
def limits(request, settings):
    """The limiter's settings on a local-memory cache, or on the run's Redis cache (the configured one)."""
    if request.param == "locmem":
        settings.CACHES = {
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": uuid.uuid4().hex}
        }
    elif not settings.REDIS_URL:
        pytest.skip("needs REDIS_URL")
    config = {"MAX_FAILURES": MAX_FAILURES, "WINDOW_MS": 60_000, "LOCKOUT_MS": 300_000, "EXEMPT_LOOPBACK": False}
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "AUTH_RATE_LIMIT": config}

    def change(**values) -> None:
        settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "AUTH_RATE_LIMIT": {**config, **values}}

    return change


@pytest.fixture
def frequent_thread_switches():
    """Threads switch every few bytecodes, so that a read-modify-write that is not atomic shows it."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def _limiter() -> tuple[AuthRateLimiter, str]:
    """A limiter scope and client address of this test's own (the counts outlive it in the cache)."""
    return AuthRateLimiter(f"test-{uuid.uuid4().hex[:8]}"), f"203.0.113.{uuid.uuid4().int % 250 + 1}"


def test_failures_recorded_at_the_same_moment_are_all_counted(limits, frequent_thread_switches):
    limiter, address = _limiter()
    threads = 16
    start = threading.Barrier(threads)

    def fail_three_times() -> list[bool]:
        start.wait()
        return [limiter.record_failure(address).locked for _ in range(3)]

    with ThreadPoolExecutor(threads) as pool:
        answers = [locked for answers in pool.map(lambda _: fail_three_times(), range(threads)) for locked in answers]
    # 48 failures at once: the first nine are answered as failures, the tenth and all later ones as locked.
    assert answers.count(False) == MAX_FAILURES - 1
    assert limiter.check(address).locked


def test_concurrent_attackers_get_no_more_than_max_failures_tries_before_the_lock(limits, frequent_thread_switches):
    """Each connection checks, tries (and fails), records, until it is refused: as the handshake does."""
    limiter, address = _limiter()
    threads = 8
    start = threading.Barrier(threads)
    tried = []

    def attack() -> None:
        start.wait()
        while not limiter.check(address).locked:
            tried.append(1)  # this guess was compared with the secret
            if limiter.record_failure(address).locked:
                return

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda _: attack(), range(threads)))
    assert limiter.check(address).locked
    # At most MAX_FAILURES before the lock, plus one guess per connection already past the check when
    # the lock was set. A lost failure (the list's get, append, set) let them go on well beyond this.
    assert MAX_FAILURES <= len(tried) <= MAX_FAILURES + threads - 1


def test_the_failure_that_reaches_the_maximum_locks_and_a_success_does_not_unlock(limits):
    limiter, address = _limiter()
    answers = [limiter.record_failure(address) for _ in range(MAX_FAILURES)]
    assert [state.locked for state in answers] == [False] * (MAX_FAILURES - 1) + [True]
    assert answers[-1].retry_after_ms == 300_000
    limiter.reset(address)  # a right secret from an attempt that was past the check before the lock
    state = limiter.check(address)
    assert state.locked and 290_000 < state.retry_after_ms <= 300_000
    # Another address and another scope are not affected.
    assert not limiter.check("203.0.113.251").locked
    assert not AuthRateLimiter("other-scope").check(address).locked


def test_a_success_starts_the_count_over(limits):
    limiter, address = _limiter()
    for _ in range(MAX_FAILURES - 1):
        limiter.record_failure(address)
    limiter.reset(address)
    assert not any(limiter.record_failure(address).locked for _ in range(MAX_FAILURES - 1))


def test_the_window_is_fixed_from_its_first_failure(limits):
    limits(MAX_FAILURES=3, WINDOW_MS=1_000)
    limiter, address = _limiter()
    assert not limiter.record_failure(address).locked
    time.sleep(0.6)
    assert not limiter.record_failure(address).locked  # does not extend the window
    time.sleep(0.6)
    # The window opened by the first failure closed: this one opens the next, counted 1.
    assert not limiter.record_failure(address).locked
    assert not limiter.record_failure(address).locked
    assert limiter.record_failure(address).locked


def test_a_window_left_without_expiry_gets_one_from_the_failure_that_opens_it(limits):
    """Django's RedisCache.incr asks EXISTS, then INCRs: a key that expires in between is made again by
    INCR without an expiry. That failure (counted 1) sets it, or the count would never end."""
    limits(MAX_FAILURES=2, WINDOW_MS=1_000)
    limiter, address = _limiter()
    fail_key, _ = limiter._keys(address)
    cache.set(fail_key, 0, timeout=None)  # what INCR leaves behind, just before it counts 1
    assert not limiter.record_failure(address).locked
    time.sleep(1.2)
    assert not limiter.record_failure(address).locked  # a new window: without the expiry, this was the 2nd


def test_exempt_and_unknown_addresses_are_never_counted(limits):
    limits(EXEMPT_LOOPBACK=True, MAX_FAILURES=1)
    limiter, _ = _limiter()
    for address in ("127.0.0.1", "::1", None, ""):
        assert not limiter.record_failure(address).locked
        assert not limiter.check(address).locked
    assert limiter.record_failure("203.0.113.7").locked  # MAX_FAILURES=1 applies to the others
