"""Read-only gateway methods answered on the event loop, on the embedded (SQLite) profile.

A database hop (channels' ``database_sync_to_async``) hands the call to the database thread and the
answer back: two thread switches, a future and the GIL changing hands twice. For a method that
reads a few rows of a local SQLite file that costs several times the query: ``sessions.list`` took
0.70 ms against ``health``'s 0.31 ms, and the loop thread spent most of its time handing calls over.
SQLite answers such a read in microseconds without waiting on anything (WAL: a reader never waits
for a writer), so the methods registered ``reads_only`` run their sync handler right on the loop
thread, as any sync thread would, on connections this module owns:

- one Django connection per database alias, opened on the loop thread when first needed and kept
  for the life of the process (a process-owned connection, never a connection of a request or
  task), bound as ``connections[alias]`` for the duration of the call only;
- read-only (``PRAGMA query_only``): a handler that writes fails (the caller gets the generic
  error, the log the cause) and writes nothing, rather than taking SQLite's write lock on the loop;
- never waiting for a lock (``busy_timeout`` 0): in the rare case SQLite answers busy (another
  connection recovering the WAL), the call is run again by a database hop, which may wait.

Every call reads the database: nothing is cached, so nothing one process (or one moment) saw is
served for another. On PostgreSQL the methods keep their hop: a query there is a network round
trip, which the event loop must not wait for. Django refuses sync database work while an event loop
runs in the thread (its guard against blocking a loop by mistake); here the loop thread runs such
work on purpose, so the guard is lifted (the running loop unset) for the call and restored after.
"""

from __future__ import annotations

import asyncio
import threading

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

_SQLITE_ENGINE = "django.db.backends.sqlite3"
_MEMORY_CACHE = "django.core.cache.backends.locmem.LocMemCache"
_SETUP = ("PRAGMA query_only = ON", "PRAGMA busy_timeout = 0")


class DatabaseBusy(Exception):
    """SQLite could not read without waiting for a lock: run the call where waiting is allowed."""


class _LoopReads:
    def __init__(self) -> None:
        self.enabled = False
        self.thread_ident: int | None = None
        self.wrappers: dict[str, BaseDatabaseWrapper] = {}
        # Per alias, the sqlite3 connection that was set up (read-only, no waiting); a wrapper holding any
        # other (a connect that failed half-way) is closed before use.
        self.ready: dict[str, Any] = {}


_state = _LoopReads()


def supported() -> bool:
    """Whether this is the embedded profile: every database a SQLite file, the cache in process memory (a read
    handler may consult the cache, and a network cache is as much a wait as a network database)."""
    return all(database["ENGINE"] == _SQLITE_ENGINE for database in settings.DATABASES.values()) and all(
        cache["BACKEND"] == _MEMORY_CACHE for cache in settings.CACHES.values()
    )


def enable() -> bool:
    """From now on, answer ``reads_only`` methods on this (the running loop's) thread where supported.

    Called by the gateway when it starts serving; returns whether it took effect.
    """
    asyncio.get_running_loop()  # a loop thread only
    if not supported():
        return False
    _state.thread_ident = threading.get_ident()
    _state.enabled = True
    return True


def disable() -> None:
    """Back to database hops for every method; the loop's connections are closed (call it on the loop thread)."""
    _state.enabled = False
    wrappers, _state.wrappers = _state.wrappers, {}
    _state.ready = {}
    with _sync_section():
        for wrapper in wrappers.values():
            wrapper.close()


def enabled() -> bool:
    return _state.enabled and _state.thread_ident == threading.get_ident()


def call(handler: Callable[..., Any], *args: Any) -> Any:
    """``handler(*args)`` on the loop thread with the loop's read-only connections (see the module).

    Raises :class:`DatabaseBusy` when SQLite answered busy: the caller runs the handler by a hop.
    """
    previous: dict[str, BaseDatabaseWrapper | None] = {}
    with _sync_section():
        try:
            _bind(previous)
            return handler(*args)
        except OperationalError as error:
            if _busy(error):
                raise DatabaseBusy from error
            raise
        finally:
            _unbind(previous)


@contextmanager
def _sync_section() -> Iterator[None]:
    loop = asyncio.get_running_loop()
    _set_running_loop(None)
    try:
        yield
    finally:
        _set_running_loop(loop)


def _bind(previous: dict[str, BaseDatabaseWrapper | None]) -> None:
    # The thread's own connections (the sync view of Django's per-thread storage, which is where
    # Django looks while no loop runs) are set aside in ``previous`` and given back after: the loop
    # thread normally has none, but a test's loop may run in a thread that holds one. The loop's
    # connect when first used (an alias no method reads is never opened).
    for alias in connections:
        wrapper = _state.wrappers.get(alias)
        if wrapper is None:
            wrapper = _state.wrappers[alias] = connections.create_connection(alias)
        elif wrapper.connection is not None and wrapper.connection is not _state.ready.get(alias):
            wrapper.close()
        previous[alias] = _current(alias)
        connections[alias] = wrapper


@receiver(connection_created, dispatch_uid="loop_reads_set_up")
def _set_up(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    if _state.wrappers.get(connection.alias) is not connection:
        return
    with connection.wrap_database_errors:
        for statement in _SETUP:
            connection.connection.execute(statement)  # the sqlite3 connection itself
    _state.ready[connection.alias] = connection.connection


def _unbind(previous: dict[str, BaseDatabaseWrapper | None]) -> None:
    for alias, wrapper in previous.items():
        if wrapper is None:
            del connections[alias]
        else:
            connections[alias] = wrapper


def _current(alias: str) -> BaseDatabaseWrapper | None:
    try:
        return getattr(connections._connections, alias)
    except AttributeError:
        return None


def _busy(error: OperationalError) -> bool:
    message = str(error).lower()
    return "locked" in message or "busy" in message


__all__ = ["DatabaseBusy", "call", "disable", "enable", "enabled", "supported"]
