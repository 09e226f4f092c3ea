"""Django's PostgreSQL backend with psycopg's pool, a connection kept by the gateway's database thread,
connection checks run only after a connection sat unused, and server-prepared statements for the
gateway's hot queries (``prepared_statement_cursor``).

Every thread checks a connection out of the pool when it first queries and gives it back at the end
of its request, task or database hop (``CONN_MAX_AGE=0``): HTTP request threads, Celery worker
threads and in-process task threads come and go, and a connection they kept would be lost to the
pool. One thread is different: the thread every gateway database hop runs on (asgiref's
process-wide ``single_thread_executor``; channels' ``database_sync_to_async`` sends each RPC call's
database work there). It lives as long as its process and runs one hop at a time, so once marked
with :func:`keep_connections_in_this_thread` (the gateway does it at start) it keeps its
connection across hops, for as long as the pool keeps a connection (``max_lifetime``): no pool
checkout and return, no Django connection setup per call. It is one of the pool's connections, so
the pool's size stays the process's ceiling; a pool of one (``OPENCLAW_DB_POOL_MAX_SIZE=1``) is
shared by taking turns, as before. What Django checks at the start and end of every hop still
applies to it (a connection left outside autocommit, or with an error it cannot answer ``SELECT 1``
after, is closed and given back to the pool, which discards a broken one); on top of that, a kept
connection left inside a transaction is given back too, so a failed hop never leaves the next one
in its transaction.

Checks. Django's ``CONN_HEALTH_CHECKS`` would ping the server before the first query of every hop
(on PostgreSQL a round trip as long as the query itself), and psycopg's pool the same on every
checkout. Here a connection is pinged before use only if it sat unused longer than
:data:`CHECK_AFTER_IDLE_S`: a pooled one at checkout (a failed one goes back to the pool, which
discards it, and another is taken), a kept one at the start of its hop (a failed one is given back
and a new one checked out, before the hop's first query or atomic block). So a server restart, or
the connection's backend killed (``pg_terminate_backend``) while idle, is noticed before a caller's
query. One that goes away inside that window fails the next query on that connection once, as a
connection that breaks mid-query does: the call gets an error, the end of the hop finds the
connection unusable and gives it back, and the next call runs on a new one.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

from django.db.backends.postgresql import base as postgresql
from django.db.backends.postgresql import operations as postgresql_operations
from psycopg import Error as PsycopgError
from psycopg.errors import FeatureNotSupported
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

CHECK_AFTER_IDLE_S = 1.0

# Checkout time per pooled connection: measured from checkout, the idle time is never underestimated.
_checked_out_at: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

_thread = threading.local()


def keep_connections_in_this_thread() -> None:
    """Connections opened from now on in the calling thread stay open across database hops.

    Only for a thread that lives as long as its process and runs one hop at a time (the gateway's
    database thread): a connection kept by a thread that ends is lost to the pool for good.
    """
    _thread.keeps_connections = True


def keeps_connections() -> bool:
    """Whether the calling thread keeps its connections across hops (see :func:`keep_connections_in_this_thread`)."""
    return getattr(_thread, "keeps_connections", False)


def _usable(connection: Any) -> bool:
    now = time.monotonic()
    last = _checked_out_at.get(connection)
    _checked_out_at[connection] = now
    if last is not None and now - last <= CHECK_AFTER_IDLE_S:
        return True
    try:
        ConnectionPool.check_connection(connection)
    except PsycopgError:
        return False
    return True


class _PreparingCursor(postgresql.ServerBindingCursor):
    """Server-side binding, the statement prepared at its first execution on a connection and its plan kept."""

    def execute(self, query, params=None, *, prepare=None, binary=None):
        prepare = True if prepare is None else prepare
        try:
            return super().execute(query, params, prepare=prepare, binary=binary)
        except FeatureNotSupported as error:
            # A table changed under the connection's prepared statements (a migration run while the gateway
            # serves): PostgreSQL refuses to run them again. Forget them all (psycopg notices the DEALLOCATE ALL
            # and prepares anew), then run this one again, once, outside any transaction it would have aborted.
            if "cached plan must not change result type" not in str(error) or not self.connection.autocommit:
                raise
            self.connection.execute("DEALLOCATE ALL")
            return super().execute(query, params, prepare=prepare, binary=binary)


class DatabaseOperations(postgresql_operations.DatabaseOperations):
    def last_executed_query(self, cursor, sql, params):
        # What the query log shows (tests, DEBUG): psycopg keeps no client-side text of a prepared statement.
        if isinstance(cursor, _PreparingCursor):
            try:
                return self.compose_sql(sql, params)
            except PsycopgError:
                return sql
        return super().last_executed_query(cursor, sql, params)


class DatabaseWrapper(postgresql.DatabaseWrapper):
    ops_class = DatabaseOperations
    # Whether the current connection stays open across hops (opened in a marked thread).
    kept = False
    # Kept connections: when it was last pinged or a hop first queried on it (at or before its last
    # use, so the time since is never less than the time the connection sat unused).
    used_at = 0.0

    def get_new_connection(self, conn_params):
        pool = self.pool
        if pool is None:
            return super().get_new_connection(conn_params)
        # As psycopg's own checking getconn does: hand a failed connection back (the pool discards
        # it) and take another, at most once per pooled connection before trusting a fresh one.
        for _attempt in range(pool.max_size):
            connection = super().get_new_connection(conn_params)
            if _usable(connection):
                return connection
            pool.putconn(connection)
        return super().get_new_connection(conn_params)

    def connect(self):
        super().connect()
        pool = self.pool
        # A pool of one connection is shared by taking turns: kept, it would leave every other thread
        # of the process (HTTP requests, the heartbeat, recovery) waiting for the pool timeout.
        self.kept = pool is not None and pool.max_size > 1 and keeps_connections()
        if self.kept:
            # Given back after as long as the pool keeps any connection (its max_lifetime, an hour by
            # default) rather than at the end of each hop, and checked before a hop's first query.
            self.close_at = time.monotonic() + pool.max_lifetime
            self.health_check_enabled = True
            self.used_at = time.monotonic()

    def prepared_statement_cursor(self):
        """A cursor (Django's wrapper, logged like any) whose statements are prepared on the server.

        For the gateway's hot read queries (gateway/prepared.py), whose SQL text is fixed: the server
        parses and plans each once per connection (~0.1 ms of a ~0.2–0.3 ms query here) instead of on every call.
        Django's own cursors bind on the client and never prepare; psycopg keeps at most ``prepared_max`` (100)
        statements per connection.
        """
        self.close_if_health_check_failed()
        self.ensure_connection()
        with self.wrap_database_errors:
            return self._prepare_cursor(_PreparingCursor(self.connection))

    def close_if_health_check_failed(self):
        # Before a hop's first query, for what runs on the kept thread without channels' hop (whose
        # start has checked already, see below).
        if self.connection is None or not self.health_check_enabled or self.health_check_done:
            return
        if self._idle_check_failed():
            self.close()
        self.used_at = time.monotonic()  # the query about to run uses (and so checks) it
        self.health_check_done = True

    def close_if_unusable_or_obsolete(self):
        # At the start and end of every hop (channels' database_sync_to_async): a kept connection is
        # given back if the hop left it inside a transaction (left open, or failed: the pool rolls it
        # back or discards it), and checked here after a pause rather than before the first query, so
        # that a connection the server dropped is replaced before the hop, not inside its atomic block.
        if self.connection is not None and self.kept and not self.in_atomic_block:
            if self.connection.info.transaction_status != TransactionStatus.IDLE or self._idle_check_failed():
                self.close()
                return
        super().close_if_unusable_or_obsolete()

    def _idle_check_failed(self) -> bool:
        """Ping a kept connection that sat unused longer than :data:`CHECK_AFTER_IDLE_S`: whether that failed."""
        now = time.monotonic()
        if now - self.used_at <= CHECK_AFTER_IDLE_S:
            return False
        self.used_at = now
        return not self.is_usable()
