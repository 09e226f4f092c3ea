"""Waiting on a node from synchronous code (tasks, turns) gives the thread's database connection back first.

A Celery worker's threads and its PostgreSQL pool have the same size: tasks that held a connection
while they waited for a node held all of them, and the waits' own connection lookups then queued
for the pool's timeout (``couldn't get a connection after 10.00 sec``).
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.db import connection, transaction
from django.utils import timezone

from devices_app.models import PairedDevice
from sessions_app.models import Run
from workers_app.nodes import calls as node_calls
from workers_app.nodes.turn_lookups import NodeTurnPlace
from workers_app.services.worker_turns import NodeTurn

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


class _Emitter:
    def start(self, started_at_ms: int) -> None:
        pass

    def delta(self, delta: str) -> None:
        pass


class _TurnOnANode(NodeTurn):
    """A node turn whose launch answers after ``launch_s`` (the node's part is not under test here)."""

    def __init__(self, launch_s: float):
        run = Run(run_id="run-1", started_at=timezone.now())
        place = NodeTurnPlace("node-1", "env-1", "lease-1", "session-1", "hash", route=None)
        super().__init__(run, None, place, [], "model", "provider", _Emitter())
        self.launch_s = launch_s

    async def _launch(self):
        await asyncio.sleep(self.launch_s)
        return {"status": "ok", "text": "done"}


@pytest.mark.parametrize(("launch_s", "still_held"), [(0.0, True), (0.3, False)])
def test_a_node_turn_gives_its_connection_back_once_it_waits_and_a_short_one_keeps_it(launch_s, still_held):
    def work() -> tuple[str, bool]:
        PairedDevice.objects.exists()
        outcome = _TurnOnANode(launch_s).run()
        return outcome.status, connection.connection is not None

    status, held = in_a_thread(work)

    assert status == "ok"
    assert held is still_held
