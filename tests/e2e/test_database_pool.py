"""What a gateway process does with its pooled PostgreSQL connections when they run out, and proof that nothing holds
one while it waits on something else (issue 27; docs/architecture.md, "Waiting").

1. Every connection in use (the pool held full by a call blocked on a table lock): other calls answer at once
   with a clear, retryable ``UNAVAILABLE`` (``DATABASE_UNAVAILABLE``) — before the blocked call is let go, so none
   waited for a connection to come back — and change nothing; over HTTP a 503 with the same error.
2. A gateway with a single pooled connection still serves calls while a turn waits on the model, dispatches a
   session to a ``local`` worker profile (the provider waits for its node host, whose connect needs the
   connection) and moves it back (the provider's destroy writes the node's records): each would have waited on
   the one connection its own waiting thread held.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import psycopg
import pytest
from django.db import connection

from gateway.exceptions import DATABASE_UNAVAILABLE_MESSAGE
from openclaw_client.client import GatewayError
from sessions_app.models import Session
from tests.e2e.test_seed_004_paired_node_worker_lifecycle import Wire, model_env, publish_workspace
from tests.support.clients import operator
from tests.support.processes import current_database_url

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

BUSY = DATABASE_UNAVAILABLE_MESSAGE
PROFILES = {"local-one": {"provider": "local", "settings": {"capacity": 1, "capacityWaitMs": 500}}}


@pytest.fixture(autouse=True)
def _postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("the connection pool is the PostgreSQL profile's")


def _waiting_on_a_lock(pid: int) -> bool:
    with psycopg.connect(current_database_url(), autocommit=True) as conn:
        return bool(
            conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
                (f"openclaw-{pid}",),
            ).fetchone()[0]
        )


def assert_busy(error: GatewayError) -> None:
    assert (error.code, error.message, error.retryable) == ("UNAVAILABLE", BUSY, True)
    assert error.details["code"] == "DATABASE_UNAVAILABLE" and len(error.details["errorId"]) == 16
    assert error.retry_after_ms == 1000


def test_calls_that_find_every_connection_in_use_answer_unavailable_at_once_and_change_nothing(gateway_factory):
    gateway = gateway_factory(
        extra_env={
            "OPENCLAW_DB_POOL_MAX_SIZE": "1",
            "OPENCLAW_DB_POOL_TIMEOUT_MS": "300",
            "OPENCLAW_TASK_MODE": "inprocess",
        }
    )
    headers = {"Authorization": f"Bearer {gateway.token}"}

    async def scenario() -> None:
        client = operator(gateway)
        await client.connect()
        try:
            await client.request("sessions.create", {"key": "agent:main:kept", "label": "before"})
            with psycopg.connect(current_database_url()) as locker:
                # Until this transaction ends, a read of the sessions table waits, holding its pooled connection
                # (a call that runs in a pool thread of its own, not on the thread most methods share).
                locker.execute("LOCK TABLE sessions_app_session IN ACCESS EXCLUSIVE MODE")
                blocked = asyncio.create_task(
                    client.request("sessions.reclaim", {"key": "agent:main:kept"}, timeout=60)
                )
                deadline = time.monotonic() + 30
                while not await asyncio.to_thread(_waiting_on_a_lock, gateway.pid):
                    assert time.monotonic() < deadline, "the call never reached the lock"
                    await asyncio.sleep(0.05)

                for method, params in (
                    ("sessions.patch", {"key": "agent:main:kept", "label": "after"}),
                    ("sessions.create", {"key": "agent:main:never"}),
                ):
                    with pytest.raises(GatewayError) as refused:
                        await client.request(method, params, timeout=60)
                    assert_busy(refused.value)
                async with httpx.AsyncClient(base_url=gateway.http_url, headers=headers, timeout=60) as http:
                    response = await http.post("/api/sessions/", json={"key": "agent:main:never-http"})
                assert response.status_code == 503
                assert response.json()["error"]["code"] == "UNAVAILABLE"
                assert response.json()["error"]["message"] == BUSY
                # Answered while the connection was still held: none of them waited for it to come back.
                assert not blocked.done()
            with pytest.raises(GatewayError) as answered:
                await blocked  # its own answer, once the lock is gone
            assert answered.value.message == "Session agent:main:kept cannot stop cloud worker from placement local"
        finally:
            await client.close()

    asyncio.run(scenario())
    assert Session.objects.get(key="agent:main:kept").label == "before"
    assert not Session.objects.filter(key__in=["agent:main:never", "agent:main:never-http"]).exists()
    # Logged as load (one line, with the reference), not as a failure with a traceback.
    log = gateway.log()
    assert "gateway method sessions.patch: no database connection could be had in time (errorId=" in log
    assert "Traceback" not in log


def test_one_pooled_connection_serves_calls_while_threads_wait_on_the_model_a_provider_and_a_node(
    gateway_factory, mock_openai, tmp_path
):
    workspace_root = tmp_path / "allowed"
    workspace_root.mkdir()
    published = publish_workspace(workspace_root)
    gateway = gateway_factory(
        extra_env={
            **model_env(mock_openai, workspace_root),
            "OPENCLAW_WORKER_PROFILES": json.dumps(PROFILES),
            "OPENCLAW_DB_POOL_MAX_SIZE": "1",
            "OPENCLAW_TASK_MODE": "inprocess",
        }
    )
    mock_openai.hold("HELD-TURN")

    async def scenario() -> None:
        client = operator(gateway)
        await client.connect()
        wire = Wire(client, published)
        try:
            key = await wire.create_session("one-connection")
            run_id = await wire.start_turn(key, "HELD-TURN")
            deadline = time.monotonic() + 30
            while "HELD-TURN" not in mock_openai.held():
                assert time.monotonic() < deadline, "the turn never reached the model"
                await asyncio.sleep(0.05)
            # The turn's thread waits on the model: the one connection is free for everyone else.
            for _ in range(3):
                assert [row["key"] for row in (await client.request("sessions.list", {}))["sessions"]] == [key]
            mock_openai.release("HELD-TURN")
            assert (await wire.wait_for_turn(run_id))["status"] == "ok"

            dispatched = await client.request("sessions.dispatch", {"key": key, "profileId": "local-one"}, timeout=120)
            assert dispatched["placement"]["state"] == "active", dispatched
            moved = await wire.move_to_gateway(key)
            assert moved["state"] == "local"
            environment = next(
                e for e in await wire.read_environments() if e["id"] == dispatched["placement"]["environmentId"]
            )
            assert environment["worker"]["state"] == "destroyed", environment
        finally:
            mock_openai.release()
            await client.close()

    asyncio.run(scenario())
    assert "no database connection could be had in time" not in gateway.log()
