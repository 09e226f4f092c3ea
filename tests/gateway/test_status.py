"""``status``: the cluster as the database knows it (live processes, oldest first, and their connections per
role), read in one query; stale processes and their connections are left out. The apps' parts of it (stored
sessions, default model) are tested with them (tests/sessions_app/test_startup_reads.py)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from gateway import rpc, state
from gateway.models import GatewayConnection, GatewayProcess
from gateway.schemas import StatusParams

pytestmark = pytest.mark.django_db


def _process(hostname: str, *, started_minutes_ago: int, heartbeat_minutes_ago: int = 0) -> GatewayProcess:
    now = timezone.now()
    return GatewayProcess.objects.create(
        boot_id=uuid.uuid4(),
        hostname=hostname,
        pid=100 + started_minutes_ago,
        started_at=now - timedelta(minutes=started_minutes_ago),
        heartbeat_at=now - timedelta(minutes=heartbeat_minutes_ago),
    )


def _connect(process: GatewayProcess, role: str, n: int = 1) -> None:
    for _ in range(n):
        conn_id = uuid.uuid4()
        GatewayConnection.objects.create(
            conn_id=conn_id,
            process=process,
            channel_name=f"inmemory!{conn_id.hex}",
            role=role,
            auth_method="token",
            node_id=conn_id.hex if role == "node" else "",
            client_id="cli",
            client_mode="cli",
            connected_at=timezone.now(),
        )


def test_status_counts_the_live_processes_connections_per_role_in_one_query():
    newer = _process("b", started_minutes_ago=1)
    older = _process("a", started_minutes_ago=5)
    _process("c", started_minutes_ago=3)  # idle: listed, with no connections
    stale = _process("gone", started_minutes_ago=60, heartbeat_minutes_ago=30)
    _connect(older, "operator", 2)
    _connect(older, "node")
    _connect(newer, "operator")
    _connect(newer, "observer")  # a role status has no fixed key for is still counted
    _connect(stale, "operator", 3)

    with CaptureQueriesContext(connection) as queries:
        status = rpc.gateway_status()

    assert len(queries) == 1
    assert [p["hostname"] for p in status["gatewayProcesses"]] == ["a", "c", "b"]
    first = status["gatewayProcesses"][0]
    assert first == {
        "bootId": str(older.boot_id),
        "hostname": "a",
        "pid": older.pid,
        "heartbeatAtMs": int(older.heartbeat_at.timestamp() * 1000),
    }
    assert status["connections"] == {
        "operator": 3,
        "node": 1,
        "observer": 1,
        "local": len(state.local_connections),
    }


def test_status_without_live_processes_still_names_both_roles():
    _process("gone", started_minutes_ago=60, heartbeat_minutes_ago=30)
    status = rpc.status_rpc(None, StatusParams())
    assert status["gatewayProcesses"] == []
    assert status["connections"] == {"operator": 0, "node": 0, "local": len(state.local_connections)}
