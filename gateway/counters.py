"""Monotonic counters in Django's cache, shared by every gateway process (Redis in production).

Through the cache's public API only: ``incr`` is atomic on Redis (``INCR``) and on the local-memory
cache (under its lock), so concurrent bumps are never lost. On Redis a bump costs two round trips
(Django's ``incr`` asks ``EXISTS`` first) and a bump-and-read one more; no hot path pays them: the
PostgreSQL profile keeps the presence version in a sequence (``hello.presence_snapshot``), the
embedded profile's cache is in memory, and the node catalog's version moves only when a node does.
"""

from django.core.cache import cache, caches
from django.core.cache.backends.redis import RedisCache


def uses_redis() -> bool:
    return isinstance(caches["default"], RedisCache)


def bump(key: str) -> int:
    """``key`` raised by one; a missing (or evicted) counter starts over at 1. Kept without expiry."""
    try:
        return cache.incr(key)
    except ValueError:  # missing: the first bump, or evicted
        # Of concurrent first bumps one add wins, the others' is a no-op: every incr still counts.
        cache.add(key, 0, timeout=None)
        return cache.incr(key)


def bump_and_read(key: str, *others: str) -> tuple[int, ...]:
    """``key`` raised by one, then the current values of ``others`` (0 when unset)."""
    bumped = bump(key)
    values = cache.get_many(others) if others else {}
    return (bumped, *(int(values.get(other) or 0) for other in others))
