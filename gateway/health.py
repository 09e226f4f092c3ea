"""The ``health`` probe of this process, cached for a second (as OpenClaw's gateway does)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from channels.db import database_sync_to_async
from django.db import connection

from .selectors import now_ms

HEALTH_MAX_AGE_S = 1.0


class _HealthCache:
    def __init__(self) -> None:
        self.snapshot: dict[str, Any] | None = None
        self.probed_at: float | None = None
        self.lock: asyncio.Lock | None = None

    def stale(self) -> bool:
        return self.probed_at is None or time.monotonic() - self.probed_at > HEALTH_MAX_AGE_S


_cache = _HealthCache()


def probe_database() -> dict[str, Any]:
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return {
        "ok": True,
        "durationMs": round((time.perf_counter() - started) * 1000, 3),
        "probedAtMs": now_ms(),
        "database": {"ok": True, "vendor": connection.vendor},
    }


def last_health() -> dict[str, Any] | None:
    return _cache.snapshot


async def health_snapshot() -> dict[str, Any]:
    """The latest probe, re-run (once, whoever asks) when older than a second.

    ``health`` answers from a recent probe instead of probing the database on every call;
    ``probedAtMs`` says how fresh it is.
    """
    if _cache.lock is None:
        _cache.lock = asyncio.Lock()
    if _cache.stale():
        async with _cache.lock:
            if _cache.stale():
                _cache.snapshot = await database_sync_to_async(probe_database)()
                _cache.probed_at = time.monotonic()
    return _cache.snapshot
