"""Read-only gateway methods answered on the event loop's thread, without a database hop.

A database hop (channels' ``database_sync_to_async``) hands the call to the database thread and the
answer back: two thread switches, a future and the GIL changing hands twice. For a method that reads
a few rows that costs several times the query: ``sessions.list`` took 0.70 ms on SQLite against
``health``'s 0.31 ms, and the loop thread spent most of its time handing calls over. So the methods
registered ``reads_only`` run their sync handler on the loop's thread, on connections this module
owns (a few per process, never a connection of a request or task), bound as ``connections[alias]``
only while the call runs:

- SQLite (the embedded profile): a read answers in microseconds without waiting on anything (WAL: a
  reader never waits for a writer), so the handler simply runs. The connection is opened when first
  needed and kept; it is read-only (``PRAGMA query_only``) and never waits for a lock
  (``busy_timeout`` 0): in the rare case SQLite answers busy (another connection recovering the
  WAL) the call is run again by a hop, which may wait.
- PostgreSQL: a query is a network round trip, which must not hold the loop. The handler runs as a
  cooperative call (openclaw_site/postgresql/cooperative.py): its waits for the server are awaited
  on the loop, which serves other connections meanwhile. Each call has a connection of its own for
  as long as it runs, one of :data:`POSTGRESQL_CONNECTIONS` kept pooled connections (taken from the
  pool, so the pool's size stays the process's ceiling), read-only while kept
  (``default_transaction_read_only``). When all are busy, or the pool has no idle connection to
  give one at once, the call takes a hop instead.

Methods that read the cache too (``reads_cache``) are answered this way only when the cache is the
process's own memory: a network cache is as much a wait as a network database, and has no
cooperative client here. A handler that writes fails (the caller gets the generic error, the log the
cause) and writes nothing.

Every call reads the database: nothing is cached, so nothing one process (or one moment) saw is
served for another. Django refuses sync database work while an event loop runs in the thread (its
guard against blocking a loop by mistake); here the loop thread runs such work on purpose, so the
guard is lifted (the running loop unset) while the handler runs, and restored whenever it stops.
"""

from __future__ import annotations

import asyncio
import threading
import time

# asyncio's own setter for the thread's running loop (what its loops call on entry and exit). Public
# in asyncio.events' __all__, underscored because only event loops are expected to need it.
from asyncio.events import _set_running_loop
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.db import OperationalError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created
from django.dispatch import receiver
from psycopg_pool import PoolTimeout

from openclaw_site.postgresql.cooperative import run_cooperatively

_SQLITE_ENGINE = "django.db.backends.sqlite3"
_POSTGRESQL_ENGINE = "openclaw_site.postgresql"
_MEMORY_CACHE = "django.core.cache.backends.locmem.LocMemCache"
_SQLITE_SETUP = ("PRAGMA query_only = ON", "PRAGMA busy_timeout = 0")

# Kept PostgreSQL connections for calls on the loop, at most; half the pool at most, so that HTTP
# requests, the database thread and in-process tasks keep the rest (none with a pool of one). With the
# default pool of 8: 4, which took sessions.list from ~1,400 to ~1,800 calls/s over 8 connections
# (2 took it to ~1,400: the other calls hop).
POSTGRESQL_CONNECTIONS = 4
POOL_RETRY_AFTER_S = 1.0


class Unavailable(Exception):
    """The call cannot run on the loop now (SQLite busy, no free connection): run it by a hop."""


class _Slot:
    """The connections (one per alias) of one call at a time."""

    def __init__(self) -> None:
        self.wrappers: dict[str, BaseDatabaseWrapper] = {}
        self.busy = False
        # After the pool had no idle connection for it: not tried again before then (monotonic time), so
        # that an exhausted pool costs the loop one short checkout attempt per slot and second, not per call.
        self.idle_pool_after = 0.0


class _LoopReads:
    def __init__(self) -> None:
        self.enabled = False
        self.thread_ident: int | None = None
        self.cooperative = False  # some alias is PostgreSQL: calls run cooperatively
        self.local_cache = False
        # SQLite, and the loop's thread had no connections of its own: the one slot's stay bound as the
        # thread's (sync-view) connections between calls, rather than being bound and unbound per call.
        self.resident = False
        self.slots: list[_Slot] = []
        # Per SQLite wrapper, the sqlite3 connection that was set up (read-only, no waiting); a wrapper
        # holding any other (a connect that failed half-way) is closed before use.
        self.ready: dict[int, Any] = {}


_state = _LoopReads()


def _connections_on_the_loop() -> int:
    """How many calls can run on the loop at once with these settings (0: none, every call hops)."""
    databases = list(settings.DATABASES.values())
    if any(database["ENGINE"] not in (_SQLITE_ENGINE, _POSTGRESQL_ENGINE) for database in databases):
        return 0
    pools = [
        database.get("OPTIONS", {}).get("pool") for database in databases if database["ENGINE"] == _POSTGRESQL_ENGINE
    ]
    if not pools:
        return 1  # SQLite only: a call runs to its end before the loop does anything else
    if not all(isinstance(pool, dict) for pool in pools):
        return 0
    return min(POSTGRESQL_CONNECTIONS, min(pool["max_size"] for pool in pools) // 2)


def supported() -> bool:
    """Whether these settings let read-only methods run on the loop (SQLite, or PostgreSQL with a pool)."""
    return _connections_on_the_loop() > 0


def enable() -> bool:
    """From now on, answer ``reads_only`` methods on this (the running loop's) thread where supported.

    Called by the gateway when it starts serving; returns whether it took effect.
    """
    asyncio.get_running_loop()  # a loop thread only
    count = _connections_on_the_loop()
    if count == 0:
        return False
    _state.cooperative = any(database["ENGINE"] == _POSTGRESQL_ENGINE for database in settings.DATABASES.values())
    _state.local_cache = all(cache["BACKEND"] == _MEMORY_CACHE for cache in settings.CACHES.values())
    _state.slots = [_Slot() for _ in range(count)]
    _state.resident = False
    if not _state.cooperative:
        with _sync_section():
            # A wrapper the thread made before serving without connecting (a vendor or settings read) is
            # dropped; one with a connection (a test's loop in a thread holding one) stays, and calls bind
            # per call instead.
            if all(_current(alias) is None or _current(alias).connection is None for alias in connections):
                for alias in connections:
                    connections[alias] = _slot_wrapper(_state.slots[0], alias)
                _state.resident = True
    _state.thread_ident = threading.get_ident()
    _state.enabled = True
    return True


async def disable() -> None:
    """Back to database hops for every method; the loop's connections are given back (on the loop thread)."""
    _state.enabled = False
    slots, _state.slots = _state.slots, []
    _state.ready = {}
    if _state.resident:
        _state.resident = False
        with _sync_section():
            for alias in connections:
                if _current(alias) is slots[0].wrappers.get(alias):
                    del connections[alias]
    for slot in slots:
        if slot.busy:
            continue  # a call still running on it (the process is stopping): its connection closes with the process
        wrappers = list(slot.wrappers.values())
        if _state.cooperative:
            await run_cooperatively(_close_all, wrappers, enter=_lift_guard, leave=_restore_guard)
        else:
            with _sync_section():
                _close_all(wrappers)


def serves(reads_cache: bool) -> bool:
    """Whether a ``reads_only`` method (one that also reads the cache: ``reads_cache``) runs on this thread's loop."""
    return _state.enabled and _state.thread_ident == threading.get_ident() and (_state.local_cache or not reads_cache)


async def call(handler: Callable[..., Any], *args: Any) -> Any:
    """``handler(*args)`` on the loop's thread with a slot of its own (see the module).

    Raises :class:`Unavailable` when it cannot run there now: the caller runs the handler by a hop.
    """
    now = time.monotonic()
    slot = next((slot for slot in _state.slots if not slot.busy and slot.idle_pool_after <= now), None)
    if slot is None:
        raise Unavailable
    slot.busy = True
    try:
        if not _state.cooperative:
            _lift_guard()
            try:
                if _state.resident:
                    _discard_half_set_up(slot)
                    return _run(slot, handler, args)
                with _bound(slot):
                    return _run(slot, handler, args)
            finally:
                _restore_guard()
        previous: dict[str, BaseDatabaseWrapper | None] = {}

        def enter() -> None:
            _lift_guard()
            _bind(slot, previous)

        def leave() -> None:
            _unbind(previous)
            _restore_guard()

        return await run_cooperatively(_run, slot, handler, args, enter=enter, leave=leave)
    finally:
        slot.busy = False


def _run(slot: _Slot, handler: Callable[..., Any], args: tuple) -> Any:
    try:
        return handler(*args)
    except OperationalError as error:
        # SQLite busy, or no idle pooled connection to take without waiting (Django wraps psycopg's error).
        if isinstance(error.__cause__, PoolTimeout):
            slot.idle_pool_after = time.monotonic() + POOL_RETRY_AFTER_S
            raise Unavailable from error
        if _busy(error):
            raise Unavailable from error
        raise
    finally:
        # As at the end of a hop: a PostgreSQL connection left in a transaction, failed or past its age is
        # given back. (A SQLite one is the process's own, kept for its life.)
        for wrapper in slot.wrappers.values():
            if wrapper.vendor == "postgresql" and wrapper.connection is not None:
                wrapper.close_if_unusable_or_obsolete()


# --- the thread as sync code expects it -------------------------------------------------------

_guarded_loops: list[asyncio.AbstractEventLoop] = []


def _lift_guard() -> None:
    _guarded_loops.append(asyncio.get_running_loop())
    _set_running_loop(None)


def _restore_guard() -> None:
    _set_running_loop(_guarded_loops.pop())


@contextmanager
def _sync_section() -> Iterator[None]:
    _lift_guard()
    try:
        yield
    finally:
        _restore_guard()


@contextmanager
def _bound(slot: _Slot) -> Iterator[None]:
    previous: dict[str, BaseDatabaseWrapper | None] = {}
    try:
        _bind(slot, previous)
        yield
    finally:
        _unbind(previous)


def _bind(slot: _Slot, previous: dict[str, BaseDatabaseWrapper | None]) -> None:
    # The thread's own connections (the sync view of Django's per-thread storage, which is where
    # Django looks while no loop runs) are set aside in ``previous`` and given back after: the loop
    # thread normally has none, but a test's loop may run in a thread that holds one. The slot's
    # connect when first used (an alias no method reads is never opened).
    _discard_half_set_up(slot)
    for alias in connections:
        wrapper = _slot_wrapper(slot, alias)
        previous[alias] = _current(alias)
        connections[alias] = wrapper


def _slot_wrapper(slot: _Slot, alias: str) -> BaseDatabaseWrapper:
    wrapper = slot.wrappers.get(alias)
    if wrapper is None:
        wrapper = slot.wrappers[alias] = connections.create_connection(alias)
        if wrapper.vendor == "postgresql":
            wrapper.cooperative = True
        else:
            # Not even while connecting (the connection's set-up statements) does the loop wait for a lock.
            options = {**wrapper.settings_dict.get("OPTIONS", {}), "timeout": 0}
            wrapper.settings_dict = {**wrapper.settings_dict, "OPTIONS": options}
    return wrapper


def _discard_half_set_up(slot: _Slot) -> None:
    # A SQLite connection whose set-up failed half-way (say, busy before ``query_only``) is never used.
    for wrapper in slot.wrappers.values():
        if wrapper.vendor == "sqlite" and wrapper.connection is not None:
            if wrapper.connection is not _state.ready.get(id(wrapper)):
                wrapper.close()


def _unbind(previous: dict[str, BaseDatabaseWrapper | None]) -> None:
    for alias, wrapper in previous.items():
        if wrapper is None:
            del connections[alias]
        else:
            connections[alias] = wrapper
    previous.clear()


def _current(alias: str) -> BaseDatabaseWrapper | None:
    # Django's handler has no way to ask for a connection without creating one.
    try:
        return getattr(connections._connections, alias)
    except AttributeError:
        return None


@receiver(connection_created, dispatch_uid="loop_reads_sqlite_set_up")
def _set_up_sqlite(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    if connection.vendor != "sqlite" or not any(
        slot.wrappers.get(connection.alias) is connection for slot in _state.slots
    ):
        return
    with connection.wrap_database_errors:
        for statement in _SQLITE_SETUP:
            connection.connection.execute(statement)  # the sqlite3 connection itself
    _state.ready[id(connection)] = connection.connection


def _close_all(wrappers: list[BaseDatabaseWrapper]) -> None:
    for wrapper in wrappers:
        wrapper.close()


def _busy(error: OperationalError) -> bool:
    message = str(error).lower()
    return "locked" in message or "busy" in message


__all__ = ["POSTGRESQL_CONNECTIONS", "Unavailable", "call", "disable", "enable", "serves", "supported"]
