"""Concurrent writers of one session over real sockets (issue 27 §5): sixteen clients that read the same
``revision`` and patch with it as ``expectedRevision`` have exactly one winner; the others get the stale-write
refusal and their labels are nowhere. Runs on both profiles (PostgreSQL with row locks, SQLite with its
database-wide write lock)."""

from __future__ import annotations

import asyncio

import pytest

from openclaw_client.client import GatewayError
from sessions_app.models import Session
from tests.support.clients import operator

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

WRITERS = 16


async def _outcome(request) -> dict | GatewayError:
    try:
        return await request
    except GatewayError as refused:
        return refused


def test_sixteen_patches_of_one_read_revision_have_exactly_one_winner(gateway):
    async def scenario():
        watcher = operator(gateway)
        await watcher.connect()
        await watcher.request("sessions.subscribe", {})
        await watcher.request("sessions.create", {"key": "contended", "label": "start"})
        writers = [operator(gateway) for _ in range(WRITERS)]
        await asyncio.gather(*(writer.connect() for writer in writers))
        reads = await asyncio.gather(*(writer.request("sessions.describe", {"key": "contended"}) for writer in writers))
        revisions = {read["session"]["revision"] for read in reads}
        (revision,) = revisions
        watcher.drain_events()
        outcomes = await asyncio.gather(
            *(
                _outcome(
                    writer.request(
                        "sessions.patch", {"key": "contended", "label": f"writer-{index}", "expectedRevision": revision}
                    )
                )
                for index, writer in enumerate(writers)
            )
        )
        changed = await watcher.next_event("sessions.changed", timeout=10)
        await asyncio.gather(*(writer.close() for writer in [watcher, *writers]))
        return revision, outcomes, changed

    revision, outcomes, changed = asyncio.run(scenario())

    won = [outcome for outcome in outcomes if isinstance(outcome, dict)]
    lost = [outcome for outcome in outcomes if isinstance(outcome, GatewayError)]
    assert revision == 1
    assert len(won) == 1 and len(lost) == WRITERS - 1
    winner = won[0]["entry"]
    assert winner["revision"] == 2
    for refused in lost:
        assert refused.code == "INVALID_REQUEST"
        assert (
            refused.message == "Session agent:main:contended changed: expected revision 1, current revision 2; retry."
        )
        assert refused.details["code"] == "SESSION_CHANGED" and refused.details["revision"] == 2
    stored = Session.objects.get(key="agent:main:contended")
    assert (stored.label, stored.revision) == (winner["label"], 2)
    assert (changed["payload"]["reason"], changed["payload"]["revision"]) == ("patch", 2)
    assert changed["payload"]["label"] == winner["label"]


def test_patches_guarded_only_by_the_lifecycle_revision_all_land_and_each_bumps_the_revision(gateway):
    """The lifecycle revision guards ownership (reset, a new owner), not writes: sixteen such patches all
    succeed, and none of their sixteen revision bumps is lost."""

    async def scenario():
        creator = operator(gateway)
        await creator.connect()
        created = await creator.request("sessions.create", {"key": "unguarded"})
        lifecycle = created["entry"]["lifecycleRevision"]
        writers = [operator(gateway) for _ in range(WRITERS)]
        await asyncio.gather(*(writer.connect() for writer in writers))
        outcomes = await asyncio.gather(
            *(
                _outcome(
                    writer.request(
                        "sessions.patch",
                        {"key": "unguarded", "label": f"writer-{index}", "expectedLifecycleRevision": lifecycle},
                    )
                )
                for index, writer in enumerate(writers)
            )
        )
        await asyncio.gather(*(writer.close() for writer in [creator, *writers]))
        return outcomes

    outcomes = asyncio.run(scenario())

    assert all(isinstance(outcome, dict) for outcome in outcomes), outcomes
    assert sorted(outcome["entry"]["revision"] for outcome in outcomes) == list(range(2, WRITERS + 2))
    assert Session.objects.get(key="agent:main:unguarded").revision == WRITERS + 1
