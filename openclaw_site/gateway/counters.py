"""Monotonic counters in Django's cache, shared by every gateway process (Redis in production)."""

from django.core.cache import cache


def bump(key: str) -> int:
    try:
        return cache.incr(key)
    except ValueError:  # first use, or evicted
        cache.add(key, 0, timeout=None)
        return cache.incr(key)
