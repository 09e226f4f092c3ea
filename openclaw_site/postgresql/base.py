"""Django's PostgreSQL backend, with the pool's connection check run only after a connection sat unused.

Django's ``CONN_HEALTH_CHECKS`` makes psycopg's pool ping the server on every checkout, and the
gateway checks a connection out for every database hop (each RPC call): a second round trip per
call, as long as the query itself. A connection that was checked out moments ago is as good as the
server that just answered on it; one that waited longer than :data:`CHECK_AFTER_IDLE_S` is pinged
as before, so a server restart or a connection dropped while idle is still noticed before a
caller's query, and a broken connection goes back to the pool (which discards it) for another.
A server that goes away inside that window fails the next query on each such connection once,
as a connection that breaks mid-query does; the pool discards it when it comes back.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from django.db.backends.postgresql import base as postgresql
from psycopg import Error as PsycopgError
from psycopg_pool import ConnectionPool

CHECK_AFTER_IDLE_S = 1.0

# Checkout time per pooled connection: measured from checkout, the idle time is never underestimated.
_checked_out_at: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


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


class DatabaseWrapper(postgresql.DatabaseWrapper):
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
