"""Reconcile before serving (workers.md §7): right after a restart, the first read already sees what startup
recovery reconciled. Recovery is slowed on purpose — the test holds a lock on the row recovery must write (the lost
worker's placement on PostgreSQL; the database's write lock on SQLite) — while an operator reads at once: the read
waits for recovery instead of answering with the pre-recovery ``active``. Real Daphne processes, real sockets."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from sessions_app.services.sessions import SessionSpec, session_create
from tests.support.clients import call_once
from tests.support.processes import current_database_url, start_gateway, stop_and_remove
from workers_app.models import Placement

from .test_seed_002_cloud_worker_disappearance import PROFILES, seed_unknown_worker_state

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# Long enough for the read to reach the gateway while recovery is held (the order is asserted, not the time).
HOLD_AFTER_READ_SENT_S = 1.5


@contextlib.contextmanager
def recovery_held(lost_session_pk: int) -> Iterator[None]:
    """Hold what startup recovery must write to fail the lost worker's placement, from outside the gateway."""
    if connection.vendor == "postgresql":
        with psycopg.connect(current_database_url().replace("postgres://", "postgresql://", 1)) as holder:
            holder.execute(
                f'SELECT 1 FROM "{Placement._meta.db_table}" WHERE "session_id" = %s FOR UPDATE', [lost_session_pk]
            )
            yield
            holder.rollback()
    else:
        holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None, timeout=30)
        try:
            holder.execute("BEGIN IMMEDIATE")
            yield
            holder.execute("ROLLBACK")
        finally:
            holder.close()


def test_the_first_read_after_a_restart_sees_the_reconciled_placement():
    lost = session_create(spec=SessionSpec(key="agent:main:reconcile-lost", agent_id="main"))
    other = session_create(spec=SessionSpec(key="agent:main:reconcile-other", agent_id="main"))
    seed_unknown_worker_state(lost, other)
    assert Placement.objects.get(pk=lost.pk).state == "active"  # what a read before recovery would show

    answered: list[tuple[float, dict]] = []
    read_sent = threading.Event()

    def read_at_once(gateway) -> None:
        read_sent.set()
        described = call_once(gateway, "sessions.describe", {"key": lost.key})
        answered.append((time.monotonic(), described["session"]["placement"]))

    gateway = None
    try:
        with recovery_held(lost.pk):
            gateway = start_gateway(worker=False, extra_env={"OPENCLAW_WORKER_PROFILES": json.dumps(PROFILES)})
            reader = threading.Thread(target=read_at_once, args=(gateway,))
            reader.start()
            assert read_sent.wait(30)
            time.sleep(HOLD_AFTER_READ_SENT_S)
            released_at = time.monotonic()
        reader.join(60)
        assert not reader.is_alive(), "the read never got an answer"
        (answered_at, placement), *_ = answered
        assert answered_at >= released_at, f"answered while recovery was held: {placement}"
        assert placement["state"] == "failed"
        assert placement["terminalReason"].startswith("cloud worker disappeared:")
    finally:
        if gateway is not None:
            stop_and_remove([gateway])
