"""Waiting on a node from synchronous code (tasks, turns) gives the thread's database connection back first.

A Celery worker's threads and its PostgreSQL pool have the same size: tasks that held a connection
while they waited for a node held all of them, and the waits' own connection lookups then queued
for the pool's timeout (``couldn't get a connection after 10.00 sec``).
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from openclaw_site.gateway.models import PairedDevice
from workers_app import node_calls

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def connections_are_not_reused_across_requests():
    if connection.settings_dict["CONN_MAX_AGE"] != 0:
        pytest.skip("connections are pooled or closed per request only with CONN_MAX_AGE=0 (PostgreSQL, tests)")


def in_a_thread(work):
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(work())
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    return outcome[0]


def test_a_thread_gives_its_connection_back_before_it_waits_on_a_node():
    def work() -> tuple[bool, bool]:
        PairedDevice.objects.exists()
        held = connection.connection is not None
        node_calls.run_on_gateway_loop(_answer_at_once)
        return held, connection.connection is None

    held_before, released_while_waiting = in_a_thread(work)

    assert held_before and released_while_waiting


def test_a_transaction_keeps_its_connection_while_it_waits():
    def work() -> tuple[bool, int]:
        with transaction.atomic():
            PairedDevice.objects.exists()
            node_calls.run_on_gateway_loop(_answer_at_once)
            still_open = connection.connection is not None and connection.in_atomic_block
            count = PairedDevice.objects.count()  # the transaction goes on
        return still_open, count

    still_open, count = in_a_thread(work)

    assert still_open and count == 0


async def _answer_at_once() -> str:
    return "answer"
