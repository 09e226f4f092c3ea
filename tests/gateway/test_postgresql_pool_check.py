"""The PostgreSQL backend pings a pooled connection on checkout only after it sat unused, and never
hands out one that fails the ping."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from openclaw_site.postgresql import base as pg_backend

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("the pool check is the PostgreSQL backend's")


def _server_pid(conn) -> int:
    return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def test_a_connection_used_moments_ago_is_not_pinged_one_idle_longer_is(monkeypatch):
    pool = connection.pool
    raw = pool.getconn()
    try:
        pings: list[object] = []
        monkeypatch.setattr(pg_backend.ConnectionPool, "check_connection", staticmethod(pings.append))
        pg_backend._checked_out_at.pop(raw, None)
        assert pg_backend._usable(raw) and pings == [raw]  # never seen: pinged
        assert pg_backend._usable(raw) and pings == [raw]  # just checked out: trusted
        pg_backend._checked_out_at[raw] -= pg_backend.CHECK_AFTER_IDLE_S + 1
        assert pg_backend._usable(raw) and pings == [raw, raw]
    finally:
        pool.putconn(raw)


def test_a_connection_the_server_dropped_while_idle_is_replaced(monkeypatch):
    connection.ensure_connection()
    victim = _server_pid(connection.connection)
    connection.close()  # back to the pool, idle
    # Terminated from another session: the pooled connection is dead without knowing it yet.
    params = connection.get_connection_params()
    params.pop("pool", None)
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [victim])
    monkeypatch.setattr(pg_backend, "CHECK_AFTER_IDLE_S", 0.0)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            assert cursor.fetchone()[0] != victim
    finally:
        # The pool may have handed out another connection first: the dead one must not reach the
        # next test (inside the idle window, unchecked).
        connection.close()
        connection.pool.check()
