"""The PostgreSQL backend pings a pooled connection on checkout only after it sat unused, and never
hands out one that fails the ping; the gateway's database thread keeps its connection across hops,
clean, and replaces it when the server drops it."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import OperationalError, close_old_connections, connection, connections, transaction
from psycopg.pq import TransactionStatus

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


# --- the connection kept by the gateway's database thread --------------------------------------


@pytest.fixture
def db_thread():
    """A thread marked as the gateway marks its database thread, and a database hop on it (what channels'
    ``database_sync_to_async`` does around the function)."""
    executor = ThreadPoolExecutor(max_workers=1, initializer=pg_backend.keep_connections_in_this_thread)

    def hop(fn):
        def run():
            close_old_connections()
            try:
                return fn()
            finally:
                close_old_connections()

        return executor.submit(run).result()

    hop.executor = executor
    yield hop
    executor.submit(connections.close_all).result()
    executor.shutdown()


def _pid_here() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _held() -> tuple[bool, Any]:
    raw = connection.connection
    return raw is not None, raw.info.transaction_status if raw is not None else None


def _terminate(pid: int) -> None:
    params = connection.get_connection_params()
    params.pop("pool", None)
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])


def test_the_marked_thread_keeps_its_connection_across_hops_another_thread_gives_it_back(db_thread):
    first = db_thread(_pid_here)
    assert db_thread(_held) == (True, TransactionStatus.IDLE)
    assert db_thread(_pid_here) == first
    assert db_thread(lambda: connection.kept) is True

    other = ThreadPoolExecutor(max_workers=1)
    try:

        def hop_elsewhere():
            close_old_connections()
            try:
                _pid_here()
            finally:
                close_old_connections()
            return connection.connection

        assert other.submit(hop_elsewhere).result() is None  # back in the pool
        assert other.submit(lambda: connection.kept).result() is False
    finally:
        other.shutdown()


def test_a_failed_atomic_block_leaves_the_kept_connection_clean(db_thread):
    first = db_thread(_pid_here)

    def fails_inside_atomic():
        with transaction.atomic():
            _pid_here()
            raise RuntimeError("the service failed")

    with pytest.raises(RuntimeError):
        db_thread(fails_inside_atomic)
    assert db_thread(_held) == (True, TransactionStatus.IDLE)
    assert db_thread(_pid_here) == first


def test_a_kept_connection_left_inside_a_transaction_is_given_back(db_thread):
    db_thread(_pid_here)

    def leaves_a_transaction_open():
        # Outside Django's atomic: a transaction Django does not know about.
        connection.connection.execute("BEGIN")
        connection.connection.execute("SELECT 1")
        return connection.connection.info.transaction_status

    assert db_thread(leaves_a_transaction_open) == TransactionStatus.INTRANS
    assert db_thread(_held) == (False, None)  # given back at the end of that hop
    db_thread(_pid_here)  # the pool rolled it back and may hand it out again: either way, clean
    assert db_thread(_held) == (True, TransactionStatus.IDLE)


def test_a_kept_connection_killed_inside_the_window_fails_one_call_then_is_replaced(db_thread, monkeypatch):
    monkeypatch.setattr(pg_backend, "CHECK_AFTER_IDLE_S", 3600.0)
    victim = db_thread(_pid_here)
    _terminate(victim)
    with pytest.raises(OperationalError):
        db_thread(_pid_here)
    replacement = db_thread(_pid_here)
    assert replacement != victim
    assert db_thread(_pid_here) == replacement


def test_a_kept_connection_killed_while_idle_is_replaced_before_the_call(db_thread, monkeypatch):
    victim = db_thread(_pid_here)
    _terminate(victim)
    monkeypatch.setattr(pg_backend, "CHECK_AFTER_IDLE_S", 0.0)  # every hop now comes after a pause
    replacement = db_thread(_pid_here)
    assert replacement != victim
    monkeypatch.setattr(pg_backend, "CHECK_AFTER_IDLE_S", 3600.0)
    assert db_thread(_pid_here) == replacement


def test_a_kept_connection_is_given_back_after_the_pools_max_lifetime(db_thread):
    db_thread(_pid_here)

    def age_past_the_lifetime():
        connection.close_at = time.monotonic() - 1

    db_thread(age_past_the_lifetime)
    assert db_thread(_held) == (False, None)
    db_thread(_pid_here)
    assert db_thread(_held) == (True, TransactionStatus.IDLE)


def test_a_pool_of_one_connection_is_never_kept(db_thread):
    pool = connection.pool
    connection.close()  # this thread's, back to the pool: the one slot must be free for the hop
    pool.resize(min_size=1, max_size=1)
    try:
        db_thread(_pid_here)
        assert db_thread(_held) == (False, None)  # given back: the process's other threads need it
    finally:
        pool.resize(min_size=pool.min_size, max_size=settings.DATABASES["default"]["OPTIONS"]["pool"]["max_size"])


def test_a_kept_connection_killed_while_idle_is_replaced_before_the_hops_atomic_block(db_thread, monkeypatch):
    victim = db_thread(_pid_here)
    _terminate(victim)
    monkeypatch.setattr(pg_backend, "CHECK_AFTER_IDLE_S", 0.0)

    def writes_in_one_transaction():
        with transaction.atomic():
            return _pid_here()

    assert db_thread(writes_in_one_transaction) != victim
    assert db_thread(_held) == (True, TransactionStatus.IDLE)


def test_a_kept_connection_used_outside_a_hop_is_still_checked_after_a_pause(db_thread, monkeypatch):
    """What runs on the kept thread without channels' hop (asgiref's sync_to_async, Django's async ORM)
    gets the check before its first query."""
    victim = db_thread(_pid_here)
    _terminate(victim)
    monkeypatch.setattr(pg_backend, "CHECK_AFTER_IDLE_S", 0.0)

    # Submitted straight to the thread: no close_old_connections around it.
    replacement = db_thread.executor.submit(_pid_here).result()
    assert replacement != victim
