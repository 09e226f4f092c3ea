"""Monotonic counters in Django's cache, shared by every gateway process (Redis in production)."""

from django.core.cache import cache, caches
from django.core.cache.backends.redis import RedisCache


def _redis() -> RedisCache | None:
    backend = caches["default"]
    return backend if isinstance(backend, RedisCache) else None


def uses_redis() -> bool:
    return _redis() is not None


def bump(key: str) -> int:
    return bump_and_read(key)[0]


def bump_and_read(key: str, *others: str) -> tuple[int, ...]:
    """``key`` raised by one, then the current values of ``others`` (0 when unset).

    On Redis one round trip: ``INCR`` creates a missing counter at 0 atomically, where Django's
    ``cache.incr`` asks ``EXISTS`` first (a round trip of its own) and refuses a missing key. Django's
    Redis cache stores integers unpickled, so ``cache.get`` reads these counters as usual.
    """
    backend = _redis()
    if backend is None:
        try:
            bumped = cache.incr(key)
        except ValueError:  # first use, or evicted
            cache.add(key, 0, timeout=None)
            bumped = cache.incr(key)
        values = cache.get_many(others) if others else {}
        return (bumped, *(int(values.get(other) or 0) for other in others))
    # The client of Django's Redis cache (its write connection pool): one pipeline, no transaction.
    pipeline = backend._cache.get_client(key, write=True).pipeline(transaction=False)
    pipeline.incr(backend.make_and_validate_key(key))
    for other in others:
        pipeline.get(backend.make_and_validate_key(other))
    bumped, *values = pipeline.execute()
    return (int(bumped), *(int(value or 0) for value in values))
