"""The ``health`` probe of this process: answered from the latest probe, refreshed in the background.

As OpenClaw's gateway does (it refreshes its health snapshot in the background), a call never waits for the
probe unless there is none yet or the latest is too old to stand for the database (a database that stopped
answering shows within seconds); a probe merely slowed by load holds up no answer.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from channels.db import DatabaseSyncToAsync
from django.db import connection

from .selectors import now_ms

# A snapshot older than this starts a new probe (one at a time).
HEALTH_MAX_AGE_S = 1.0
# Older than this, callers wait for the probe in flight instead of answering with the last one.
HEALTH_WAIT_AGE_S = 5.0

# One thread of its own: the probe asks whether the database answers, and must not wait behind every
# request's database work in the request thread (under a burst of big chat.send calls it waited seconds).
probe_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gateway-health")


class HealthCache:
    """The latest probe and the refresh in flight. Public so that a test can start from a cache of its own
    (``monkeypatch.setattr(health, "probe_cache", HealthCache())``) and wait for a refresh."""

    def __init__(self) -> None:
        self.snapshot: dict[str, Any] | None = None
        self.probed_at: float | None = None
        self.refresh: asyncio.Task | None = None

    def age(self) -> float | None:
        return None if self.probed_at is None else time.monotonic() - self.probed_at


probe_cache = HealthCache()


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
    return probe_cache.snapshot


async def _probe() -> dict[str, Any]:
    snapshot = await DatabaseSyncToAsync(probe_database, thread_sensitive=False, executor=probe_pool)()
    probe_cache.snapshot, probe_cache.probed_at = snapshot, time.monotonic()
    return snapshot


def _seen(task: asyncio.Task) -> None:
    # A failed probe nobody waited for is retried by the next call, and a caller that waits gets its error.
    if not task.cancelled():
        task.exception()


def _refresh() -> asyncio.Task:
    """The probe in flight, started if there is none (on this event loop)."""
    refresh = probe_cache.refresh
    if refresh is None or refresh.done() or refresh.get_loop() is not asyncio.get_running_loop():
        refresh = probe_cache.refresh = asyncio.ensure_future(_probe())
        refresh.add_done_callback(_seen)
    return refresh


async def health_snapshot() -> dict[str, Any]:
    """The latest probe; one older than :data:`HEALTH_MAX_AGE_S` starts the next in the background, and a
    caller waits for it only when there is no probe yet or the latest is older than :data:`HEALTH_WAIT_AGE_S`.
    ``probedAtMs`` says how fresh the answer is."""
    age = probe_cache.age()
    if age is None or age > HEALTH_MAX_AGE_S:
        refresh = _refresh()
        if age is None or age > HEALTH_WAIT_AGE_S or probe_cache.snapshot is None:
            # Shielded: a caller that gives up (a cancel frame) does not cancel the others' probe.
            return await asyncio.shield(refresh)
    return probe_cache.snapshot
