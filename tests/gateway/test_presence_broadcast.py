"""Presence broadcasts coalesce per process: a join storm sends a few lists, not one per join, and
the last one carries the final state."""

from __future__ import annotations

import asyncio
import logging

import pytest
from django.db import connection

from gateway import state
from gateway.hello import (
    PRESENCE_BROADCAST_MAX_INTERVAL_S,
    PresenceBroadcaster,
    presence_broadcast_interval_s,
    presence_snapshot,
)
from gateway.selectors import presence_snapshot_sql


class World:
    """The presence a snapshot read would see, the reads made and the broadcasts published."""

    def __init__(self) -> None:
        self.entries: list[str] = []
        self.version = 0
        self.reads: list[bool] = []
        self.published: list[tuple[list, dict]] = []
        self.release = asyncio.Event()
        self.release.set()
        self.publish_fails = False
        self.slow_reads = False  # a read yields between its version bump and its list read

    def connect(self, name: str) -> tuple[list, dict]:
        """A connect: registered, version bumped, its hello-ok snapshot taken (as accept_connect does)."""
        self.entries.append(name)
        self.version += 1
        return list(self.entries), {"presence": self.version}

    def disconnect(self, name: str) -> None:
        self.entries.remove(name)

    async def read_snapshot(self) -> tuple[list, dict]:
        """Bumps the version, then reads the list (as presence_snapshot does); a change may land meanwhile."""
        self.version += 1
        version = self.version
        if self.slow_reads:
            await asyncio.sleep(0)
        self.reads.append(version)
        return list(self.entries), {"presence": version}

    async def publish(self, snapshot: tuple[list, dict]) -> None:
        await self.release.wait()
        if self.publish_fails:
            raise ConnectionError("Too many connections")
        self.published.append(snapshot)


def _broadcaster(world: World) -> PresenceBroadcaster:
    return PresenceBroadcaster(interval_s=lambda: 0, read_snapshot=world.read_snapshot, publish=world.publish)


async def _settled(broadcaster: PresenceBroadcaster) -> None:
    while broadcaster._task is not None and not broadcaster._task.done():
        await asyncio.sleep(0)


def test_a_lone_connect_goes_out_at_once_with_its_hello_snapshot():
    world = World()

    async def scenario():
        broadcaster = _broadcaster(world)
        broadcaster.changed(world.connect("a"))
        await _settled(broadcaster)

    asyncio.run(scenario())
    assert world.published == [(["a"], {"presence": 1})]
    assert world.reads == []  # no database hop beyond the hello's


def test_a_join_storm_is_coalesced_and_converges_to_the_final_list():
    world = World()

    async def scenario():
        broadcaster = _broadcaster(world)
        world.release.clear()  # the first broadcast is in flight while the others join
        broadcaster.changed(world.connect("n0"))
        await asyncio.sleep(0)
        for i in range(1, 50):
            broadcaster.changed(world.connect(f"n{i}"))
        world.release.set()
        await _settled(broadcaster)

    asyncio.run(scenario())
    assert world.published == [(["n0"], {"presence": 1}), ([f"n{i}" for i in range(50)], {"presence": 51})]
    assert world.reads == [51]  # one read for the 49 coalesced connects


def test_a_leave_storm_bumps_the_version_once_and_ends_with_the_final_list():
    world = World()
    names = [f"n{i}" for i in range(20)]
    for name in names:
        world.connect(name)

    async def scenario():
        broadcaster = _broadcaster(world)
        world.release.clear()
        for name in names[:-1]:
            world.disconnect(name)
            broadcaster.changed(None)
        await asyncio.sleep(0)  # the first read happened; the last one leaves while it is in flight
        world.disconnect(names[-1])
        broadcaster.changed(None)
        world.release.set()
        await _settled(broadcaster)

    asyncio.run(scenario())
    assert len(world.reads) == 2
    assert world.published[-1] == ([], {"presence": 22})
    versions = [version["presence"] for _entries, version in world.published]
    assert versions == sorted(set(versions))


def test_a_leave_that_lands_while_a_join_is_read_never_shares_that_lists_version():
    """A join storm leaves a coalesced read under way; the crowd leaves before the read returns the list.
    Each read bumps the version first, so the join's list and the leave's list carry different versions."""
    world = World()
    world.slow_reads = True

    async def scenario():
        broadcaster = _broadcaster(world)
        broadcaster.changed(world.connect("admin"))
        await _settled(broadcaster)
        for name in ("c1", "c2"):
            broadcaster.changed(world.connect(name))
        await asyncio.sleep(0)  # the coalesced read bumped the version and is under way
        for name in ("c1", "c2"):
            world.disconnect(name)
            broadcaster.changed(None)
        await _settled(broadcaster)

    asyncio.run(scenario())
    versions = [version["presence"] for _entries, version in world.published]
    assert versions == sorted(set(versions))  # never two broadcasts with one version
    assert world.published[-1][0] == ["admin"]


def test_a_connect_during_a_broadcast_is_read_again_not_sent_with_its_older_snapshot():
    world = World()
    world.connect("a")

    async def scenario():
        broadcaster = _broadcaster(world)
        world.release.clear()
        world.disconnect("a")
        broadcaster.changed(None)  # reads ([], v2) and waits to publish
        await asyncio.sleep(0)
        broadcaster.changed(world.connect("b"))
        world.release.set()
        await _settled(broadcaster)

    asyncio.run(scenario())
    # b's hello bumped to 3; the fresh read that follows bumps again: each list its own version.
    assert world.published == [([], {"presence": 2}), (["b"], {"presence": 4})]
    assert world.reads == [2, 4]


def test_a_failed_broadcast_is_logged_and_the_next_change_broadcasts_again(caplog):
    world = World()

    async def scenario():
        broadcaster = _broadcaster(world)
        world.publish_fails = True
        with caplog.at_level(logging.ERROR):
            broadcaster.changed(world.connect("a"))
            await _settled(broadcaster)
        world.publish_fails = False
        broadcaster.changed(world.connect("b"))
        await _settled(broadcaster)

    asyncio.run(scenario())
    assert any("failed to broadcast presence" in r.getMessage() for r in caplog.records)
    assert world.published == [(["a", "b"], {"presence": 2})]


def test_changes_within_the_interval_wait_for_its_end():
    world = World()
    now = [100.0]
    slept: list[float] = []

    async def scenario():
        broadcaster = PresenceBroadcaster(
            interval_s=lambda: 0.25, read_snapshot=world.read_snapshot, publish=world.publish, clock=lambda: now[0]
        )
        broadcaster.changed(world.connect("a"))
        await _settled(broadcaster)
        now[0] += 0.1
        real_sleep = asyncio.sleep

        async def fake_sleep(seconds: float) -> None:
            if seconds:  # not the test's own yields
                slept.append(seconds)
            await real_sleep(0)

        asyncio.sleep = fake_sleep
        try:
            broadcaster.changed(world.connect("b"))
            await _settled(broadcaster)
        finally:
            asyncio.sleep = real_sleep

    asyncio.run(scenario())
    assert slept == [pytest.approx(0.15)]
    assert world.published == [(["a"], {"presence": 1}), (["a", "b"], {"presence": 2})]


@pytest.mark.django_db
def test_a_snapshot_reads_the_version_before_the_entries(monkeypatch):
    if connection.vendor == "postgresql":
        # One script: the version's statement first; each statement sees what committed before it began.
        sql, _params = presence_snapshot_sql()
        bump, read = sql.split(";\n")
        assert "nextval" in bump and "nextval" not in read and read.startswith("SELECT c.conn_id")
        return
    order: list[str] = []
    monkeypatch.setattr("gateway.hello.presence_entries", lambda: order.append("entries") or [])
    monkeypatch.setattr("gateway.hello.counters.bump_and_read", lambda *keys: order.append("version") or (1, 0))
    presence_snapshot()
    presence_snapshot()
    assert order == ["version", "entries", "version", "entries"]


def test_the_interval_grows_with_the_local_connections_up_to_a_bound(monkeypatch):
    monkeypatch.setattr(state, "local_connections", [object()] * 1000)
    assert presence_broadcast_interval_s() == pytest.approx(1.25)
    monkeypatch.setattr(state, "local_connections", [object()] * 100_000)
    assert presence_broadcast_interval_s() == PRESENCE_BROADCAST_MAX_INTERVAL_S
    monkeypatch.setattr(state, "local_connections", [])
    assert presence_broadcast_interval_s() == pytest.approx(0.25)
