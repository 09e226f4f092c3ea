"""Ticks, presence, graceful shutdown, and the CLI against a running gateway."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from tests.support.clients import operator, paired_node
from tests.support.processes import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_ticks_arrive_with_contiguous_seq(gateway_factory):
    server = gateway_factory(extra_env={"OPENCLAW_TICK_INTERVAL_MS": "200"})

    async def scenario():
        client = operator(server)
        hello = await client.connect()
        ticks = [await client.next_event("tick", timeout=5) for _ in range(3)]
        await client.close()
        return hello, ticks

    hello, ticks = asyncio.run(scenario())
    assert hello["policy"]["tickIntervalMs"] == 200
    seqs = [t["seq"] for t in ticks]
    assert all(isinstance(t["payload"]["ts"], int) for t in ticks)
    assert seqs == sorted(seqs) and len(set(seqs)) == 3


def test_presence_is_broadcast_on_connect_and_disconnect(gateway):
    async def scenario():
        watcher = operator(gateway)
        await watcher.connect()
        other = operator(gateway, display_name="second operator")
        await other.connect()
        joined = await watcher.next_event(
            "presence", predicate=lambda e: any(p.get("deviceId") == other.device_id for p in e["payload"]["presence"])
        )
        await other.close()
        left = await watcher.next_event(
            "presence",
            predicate=lambda e: all(p.get("deviceId") != other.device_id for p in e["payload"]["presence"]),
        )
        await watcher.close()
        return joined, left

    joined, left = asyncio.run(scenario())
    assert joined["stateVersion"]["presence"] < left["stateVersion"]["presence"]
    assert joined["seq"] < left["seq"]


def test_sigterm_sends_shutdown_before_closing(gateway_factory):
    server = gateway_factory()

    async def scenario():
        client = operator(server)
        await client.connect()
        server.process.terminate()
        shutdown = await client.next_event("shutdown", timeout=10)
        await asyncio.wait_for(client.closed.wait(), 10)
        return shutdown, client.close_code

    shutdown, close_code = asyncio.run(scenario())
    assert shutdown["payload"] == {"reason": "gateway stopping"}
    assert close_code == 1012
    assert server.process.wait(20) == 0


def test_gateway_call_cli_prints_json(gateway, tmp_path):
    def cli(*args):
        return subprocess.run(
            [
                sys.executable,
                "manage.py",
                "gateway",
                "call",
                *args,
                "--url",
                gateway.url,
                "--token",
                gateway.token,
                "--state-dir",
                str(tmp_path),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    ok = cli("node.list")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["nodes"] == []
    failed = cli("no.such.method")
    assert (failed.returncode, failed.stdout, failed.stderr) == (
        1,
        "",
        "error: INVALID_REQUEST: unknown method: no.such.method\n",
    )
    bad_params = cli("health", "--params", "{not json")
    assert bad_params.returncode == 2


def test_connection_churn_leaves_no_stale_registrations(gateway):
    """Clients that vanish while presence is broadcast to them must still be unregistered."""

    async def churn_round():
        clients = [operator(gateway) for _ in range(8)]
        await asyncio.gather(*(c.connect() for c in clients))
        await asyncio.gather(*(c.close() for c in clients))

    async def scenario():
        for _ in range(10):
            await churn_round()
        watcher = operator(gateway)
        await watcher.connect()
        async with asyncio.timeout(10):
            while (status := await watcher.request("status"))["connections"]["operator"] != 1:
                await asyncio.sleep(0.1)
        await watcher.close()
        return status

    status = asyncio.run(scenario())
    assert status["connections"]["operator"] == 1
    assert status["connections"]["local"] == 1
    assert "Exception inside application" not in gateway.log()


def test_presence_converges_for_every_connection_after_a_join_and_leave_storm(gateway):
    """Presence broadcasts are coalesced per process; the last one still carries the final list, to
    operators and nodes alike, and every connection's seq stays contiguous."""

    def devices(event: dict) -> set[str]:
        return {entry.get("deviceId") for entry in event["payload"]["presence"]}

    async def until(client, predicate, seen: list[dict]) -> dict:
        async with asyncio.timeout(20):
            while True:
                frame = await client.events.get()
                seen.append(frame)
                if frame.get("event") == "presence" and predicate(frame):
                    return frame

    async def scenario():
        admin = operator(gateway)
        await admin.connect()
        worker = await paired_node(gateway, admin)
        crowd = [operator(gateway, display_name=f"crowd {i}") for i in range(12)]
        await asyncio.gather(*(client.connect() for client in crowd))
        crowd_ids = {client.device_id for client in crowd}
        seen = {"admin": [], "node": []}
        joined = {
            "admin": await until(admin, lambda e: crowd_ids <= devices(e), seen["admin"]),
            "node": await until(worker, lambda e: crowd_ids <= devices(e), seen["node"]),
        }
        await asyncio.gather(*(client.close() for client in crowd))
        left = {
            "admin": await until(admin, lambda e: not crowd_ids & devices(e), seen["admin"]),
            "node": await until(worker, lambda e: not crowd_ids & devices(e), seen["node"]),
        }
        await worker.close()
        await admin.close()
        return joined, left, seen, admin.device_id, worker.device_id

    joined, left, seen, admin_id, node_id = asyncio.run(scenario())
    for who in ("admin", "node"):
        assert devices(left[who]) == {admin_id, node_id}
        assert joined[who]["stateVersion"]["presence"] < left[who]["stateVersion"]["presence"]
        seqs = [frame["seq"] for frame in seen[who] if "seq" in frame]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert left["admin"]["stateVersion"] == left["node"]["stateVersion"]
