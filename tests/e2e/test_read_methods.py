"""Read methods (sessions.list / describe, status, node.list / describe) against a real gateway.

They take the database hop every method takes: they see every committed write at once, whoever
made it, and keep answering while turns write.
"""

from __future__ import annotations

import asyncio

import pytest
from django.db import connection

from sessions_app.models import Session
from tests.support.clients import operator

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_reads_see_committed_writes_at_once_including_another_process(gateway):
    async def scenario() -> tuple[dict, dict, dict]:
        client = operator(gateway)
        await client.connect()
        try:
            created = await client.request("sessions.create", {"key": "reader-1", "label": "first"})
            described = await client.request("sessions.describe", {"key": created["key"]})
            # Written by this test's process, not the gateway: no memo of the gateway may hide it.
            await asyncio.to_thread(_relabel, created["key"], "changed elsewhere")
            after_foreign_write = await client.request("sessions.describe", {"key": created["key"]})
            listed = await client.request("sessions.list", {"limit": 10})
            return described, after_foreign_write, listed
        finally:
            await client.close()

    described, after_foreign_write, listed = asyncio.run(scenario())

    assert described["session"]["label"] == "first"
    assert after_foreign_write["session"]["label"] == "changed elsewhere"
    assert [(row["key"], row["label"]) for row in listed["sessions"]] == [
        (after_foreign_write["session"]["key"], "changed elsewhere")
    ]


def test_reads_keep_answering_while_turns_write(gateway):
    turns, readers, reads_each = 6, 4, 25
    log_start = len(gateway.log())  # the gateway is shared: what earlier tests had it log is theirs

    async def turn(client, index: int) -> str:
        await client.request("sessions.create", {"key": f"busy-{index}"})
        sent = await client.request(
            "chat.send", {"sessionKey": f"busy-{index}", "message": f"hello {index}", "idempotencyKey": f"k{index}"}
        )
        waited = await client.request("agent.wait", {"runId": sent["runId"], "timeoutMs": 30_000})
        return waited["status"]

    async def reader(client) -> list[str]:
        methods = []
        for round_number in range(reads_each):
            method = ("sessions.list", "status", "node.list", "sessions.describe")[round_number % 4]
            params = {"key": "busy-0"} if method == "sessions.describe" else {}
            await client.request(method, params)
            methods.append(method)
        return methods

    async def scenario() -> tuple[list[str], list[list[str]], dict]:
        writer = operator(gateway)
        readers_clients = [operator(gateway) for _ in range(readers)]
        await writer.connect()
        await asyncio.gather(*(client.connect() for client in readers_clients))
        try:
            # The first turn creates busy-0, which the readers describe.
            first = await turn(writer, 0)
            results = await asyncio.gather(
                *(turn(writer, index) for index in range(1, turns)),
                *(reader(client) for client in readers_clients),
            )
            listed = await writer.request("sessions.list", {"limit": 50})
            return [first, *results[: turns - 1]], list(results[turns - 1 :]), listed
        finally:
            await asyncio.gather(writer.close(), *(client.close() for client in readers_clients))

    statuses, reads, listed = asyncio.run(scenario())

    assert statuses == ["ok"] * turns
    assert [len(methods) for methods in reads] == [reads_each] * readers  # every read answered, none failed
    assert sorted(row["key"] for row in listed["sessions"]) == sorted(Session.objects.values_list("key", flat=True))
    assert {f"agent:main:busy-{index}" for index in range(turns)} <= {row["key"] for row in listed["sessions"]}
    log = gateway.log()[log_start:]
    assert "Traceback" not in log, log[max(0, log.find("Traceback") - 2000) :]


def _relabel(key: str, label: str) -> None:
    Session.objects.filter(key=key).update(label=label)
    connection.close()  # this thread's connection, opened for the update
