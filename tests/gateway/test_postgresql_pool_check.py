"""PostgreSQL on Django's own backend and psycopg's pool (settings: ``OPTIONS["pool"]``, ``CONN_HEALTH_CHECKS``):
every database hop gives its connection back, clean, and the pool pings a connection as it hands it out,
so one the server dropped while idle never reaches a caller."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import connection, transaction
from psycopg.pq import TransactionStatus

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("the pool is the PostgreSQL profile's")


def _hop(fn):
    """``fn`` as a gateway method runs: one ``database_sync_to_async`` hop, on asgiref's database thread."""
    return asyncio.run(database_sync_to_async(fn)())


def _pid_here() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _terminate(pid: int) -> None:
    params = connection.get_connection_params()
    params.pop("pool", None)
    with psycopg.connect(**params, autocommit=True) as admin:
        # With a timeout it returns once the backend has gone, not as soon as it was signalled.
        assert admin.execute("SELECT pg_terminate_backend(%s, 5000)", [pid]).fetchone()[0]


def _idle_in_pool() -> int:
    return connection.pool.get_stats()["pool_available"]


def test_the_settings_use_djangos_backend_with_a_checking_pool():
    database = settings.DATABASES["default"]

    assert database["ENGINE"] == "django.db.backends.postgresql"
    assert database["CONN_MAX_AGE"] == 0 and database["CONN_HEALTH_CHECKS"] is True
    assert connection.pool.max_size == settings.DB_POOL_MAX_SIZE


def test_a_hop_gives_its_connection_back_to_the_pool():
    connection.close()  # this thread's: every connection the pool has is then the hops' to take

    def held_and_idle_during() -> tuple[bool, int]:
        _pid_here()
        return connection.connection is not None, _idle_in_pool()

    held, idle_during = _hop(held_and_idle_during)

    assert held
    assert _hop(lambda: connection.connection) is None  # the database thread holds none between hops
    stats = connection.pool.get_stats()
    assert stats["pool_available"] == stats["pool_size"] == idle_during + 1


def test_a_connection_the_server_dropped_while_idle_is_replaced_before_the_callers_query():
    victim = _hop(_pid_here)
    _terminate(victim)  # from another session: the pooled connection is dead without knowing it yet

    served = [_hop(_pid_here) for _ in range(connection.pool.max_size)]

    assert victim not in served


def test_a_failed_atomic_block_leaves_the_next_hop_a_clean_connection():
    def fails_inside_atomic():
        with transaction.atomic():
            _pid_here()
            raise RuntimeError("the service failed")

    with pytest.raises(RuntimeError, match="the service failed"):
        _hop(fails_inside_atomic)

    assert _hop(lambda: (_pid_here(), connection.connection.info.transaction_status)[1]) == TransactionStatus.IDLE


def test_a_connection_left_inside_a_transaction_is_rolled_back_by_the_pool():
    def leaves_a_transaction_open() -> int:
        # Outside Django's atomic: a transaction Django does not know about, with a row in it.
        connection.ensure_connection()
        connection.connection.execute("BEGIN")
        connection.connection.execute("CREATE TEMPORARY TABLE left_open (id int) ON COMMIT DROP")
        return connection.connection.info.transaction_status

    assert _hop(leaves_a_transaction_open) == TransactionStatus.INTRANS

    def table_and_status() -> tuple[bool, TransactionStatus]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT to_regclass('pg_temp.left_open') IS NOT NULL")
            exists = cursor.fetchone()[0]
        return exists, connection.connection.info.transaction_status

    for _ in range(connection.pool.max_size):  # whichever pooled connection comes next
        assert _hop(table_and_status) == (False, TransactionStatus.IDLE)
