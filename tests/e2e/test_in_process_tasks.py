"""Turns of an embedded gateway run in its own threads: more of them at once than the event loop's default
executor has threads all end, and calls that need that executor meanwhile are answered."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.clients import operator

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

TURNS = 16


def test_more_turns_at_once_than_the_loops_default_executor_has_threads_all_end(gateway):
    async def turn(client, index: int) -> str:
        key = f"many-{index}"
        await client.request("sessions.create", {"key": key})
        sent = await client.request(
            "chat.send", {"sessionKey": key, "message": f"hello {index}", "idempotencyKey": f"many-{index}"}
        )
        waited = await client.request("agent.wait", {"runId": sent["runId"], "timeoutMs": 60_000}, timeout=90)
        return waited["status"]

    async def scenario() -> list[str]:
        clients = [operator(gateway) for _ in range(4)]
        await asyncio.gather(*(client.connect() for client in clients))
        try:
            return await asyncio.gather(*(turn(clients[index % 4], index) for index in range(TURNS)))
        finally:
            await asyncio.gather(*(client.close() for client in clients))

    assert asyncio.run(scenario()) == ["ok"] * TURNS
