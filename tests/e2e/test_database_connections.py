"""A gateway process holds a bounded number of PostgreSQL connections, whatever the load.

Django runs each HTTP request's sync code in a thread of its own; with persistent connections
every such thread left one behind, and ~8,000 API requests exhausted the server's
``max_connections``. The pool (``OPENCLAW_DB_POOL_MAX_SIZE``) is the ceiling.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest
from django.db import connection

from openclaw_client.client import GatewayError
from tests.support.clients import operator
from tests.support.processes import current_database_url

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

POOL_SIZE = 3


def _connections_of(pid: int) -> int:
    with psycopg.connect(current_database_url(), autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (f"openclaw-{pid}",)
        ).fetchone()[0]


def test_sustained_api_and_websocket_load_stays_within_the_pool(gateway_factory):
    if connection.vendor != "postgresql":
        pytest.skip("connection pooling is PostgreSQL's (SQLite has no server connections)")
    gateway = gateway_factory(extra_env={"OPENCLAW_DB_POOL_MAX_SIZE": str(POOL_SIZE)})
    headers = {"Authorization": f"Bearer {gateway.token}"}
    statuses: list[int] = []
    peak = 0
    done = threading.Event()

    def api_calls(n: int) -> None:
        with httpx.Client(base_url=gateway.http_url, headers=headers, timeout=30) as client:
            for i in range(40):
                created = client.post("/api/sessions/", json={"key": f"load-{n}-{i}"})
                listed = client.get("/api/sessions/", params={"limit": 5})
                described = client.get(f"/api/sessions/load-{n}-{i}")
                statuses.extend([created.status_code, listed.status_code, described.status_code])

    async def websocket_calls() -> None:
        client = operator(gateway)
        await client.connect()
        try:
            for _ in range(100):
                await client.request("sessions.list", {"limit": 5})
                await client.request("status")
        finally:
            await client.close()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _connections_of(gateway.pid))
            done.wait(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(api_calls, n) for n in range(8)]
            asyncio.run(websocket_calls())
            for future in futures:
                future.result()
    finally:
        done.set()
        sampler.join()

    assert statuses and set(statuses) <= {200, 201}, sorted(set(statuses))
    assert len(statuses) == 8 * 40 * 3
    assert 1 <= peak <= POOL_SIZE
    assert _connections_of(gateway.pid) <= POOL_SIZE


def _sessions_query_backends(pid: int) -> list[int]:
    """Server pids of the gateway's connections whose latest statement read the sessions table (a
    ``sessions.list`` page, SQL text of its own: gateway.sql_reads)."""
    with psycopg.connect(current_database_url(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND query LIKE %s",
            (f"openclaw-{pid}", '%FROM "sessions_app_session"%'),
        ).fetchall()
    return [row[0] for row in rows]


def _terminate(backend_pid: int) -> None:
    with psycopg.connect(current_database_url(), autocommit=True) as conn:
        # With a timeout it returns once the backend has gone, not as soon as it was signalled.
        assert conn.execute("SELECT pg_terminate_backend(%s, 5000)", (backend_pid,)).fetchone()[0]


def test_connections_the_server_killed_cost_at_most_one_call(gateway_factory):
    """Every call takes a connection from the pool and gives it back; those that served killed, the next
    call succeeds (the pool pings a connection as it hands it out) or fails once with a generic error, and
    the calls after it run on new connections."""
    if connection.vendor != "postgresql":
        pytest.skip("server connections are PostgreSQL's")
    gateway = gateway_factory()

    async def scenario() -> None:
        client = operator(gateway)
        await client.connect()
        try:
            for _ in range(20):
                await client.request("sessions.list", {"limit": 5})
            served = _sessions_query_backends(gateway.pid)
            assert 1 <= len(served) <= 8, served

            for backend_pid in served:
                _terminate(backend_pid)
            try:
                await client.request("sessions.list", {"limit": 5})
            except GatewayError as error:
                assert error.code == "UNAVAILABLE"
                assert "terminat" not in error.message and "SQL" not in error.message
            for _ in range(10):
                assert (await client.request("sessions.list", {"limit": 5}))["sessions"] == []
            renewed = _sessions_query_backends(gateway.pid)
            assert renewed and not set(renewed) & set(served)
            assert (await client.request("status")) is not None
        finally:
            await client.close()

    asyncio.run(scenario())
    assert _connections_of(gateway.pid) <= 8
    # At most the one call that ran into a killed connection failed (logged with its reference).
    assert gateway.log().count("gateway method sessions.list") <= 1
