"""Bursts of identical placement operations (issue 27): 16 and then 64 connections to a real gateway on PostgreSQL
send the same ``sessions.move``, ``sessions.dispatch``, ``sessions.reclaim`` or ``recoverToGateway`` at once, for a
session on a ``local`` worker profile (a real node host process per environment).

Each call joins the one operation under way (and answers its outcome) or is refused at once as stale; none waits
for a database pool timeout, none answers ``UNAVAILABLE``. Afterwards the placement's history is one linear chain,
every environment the session had is torn down (or, after a dispatch burst, exactly one is attached, with every
worker slot of its node free), and no node host or local worker pairing is left behind.

Before the fix, a move burst held every pooled connection in threads that waited on the provider whose own
queries needed one: calls waited out the pool's 10 s, and a placement could be left ``failed`` with its
environment (and its node host) alive.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from devices_app.models import PairedDevice
from openclaw_client.client import GatewayClient, GatewayError
from sessions_app.models import Session
from tests.e2e.test_seed_004_paired_node_worker_lifecycle import publish_workspace
from tests.support.clients import move_back_params, operator
from workers_app.models import Placement, PlacementHistory, PlacementMove, WorkerEnvironment
from workers_app.services import placements as store
from workers_app.services.placements import Actor

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PROFILE = "local-burst"
PROFILES = {PROFILE: {"provider": "local", "settings": {"capacity": 2, "capacityWaitMs": 500}}}
SIZES = (16, 64)
TIMEOUT_S = 120


@pytest.fixture(autouse=True)
def _postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("the pool that a burst exhausted is the PostgreSQL profile's")


@pytest.fixture
def rig(gateway_factory, tmp_path):
    workspace_root = tmp_path / "allowed"
    workspace_root.mkdir()
    published = publish_workspace(workspace_root)
    gateway = gateway_factory(
        extra_env={
            "OPENCLAW_WORKSPACE_ROOTS": str(workspace_root),
            "OPENCLAW_WORKER_PROFILES": json.dumps(PROFILES),
            # The dispatch stages run in the gateway process too: its pool serves them, the calls and the node
            # hosts' connects (and no Celery worker has to start).
            "OPENCLAW_TASK_MODE": "inprocess",
        },
    )
    return Rig(gateway, published)


class Rig:
    def __init__(self, gateway, published: Path):
        self.gateway = gateway
        self.published = published

    async def connect(self, count: int) -> list[GatewayClient]:
        clients = [operator(self.gateway) for _ in range(count)]
        await asyncio.gather(*(client.connect() for client in clients))
        return clients

    async def session(self, client: GatewayClient, name: str) -> str:
        key = f"agent:main:{name}"
        await client.request(
            "sessions.create",
            {"key": key, "worktree": True, "worktreeName": name, "worktreeBaseRef": "main", "cwd": str(self.published)},
        )
        return key

    async def dispatched(self, client: GatewayClient, key: str) -> dict[str, Any]:
        answer = await client.request("sessions.dispatch", {"key": key, "profileId": PROFILE}, timeout=TIMEOUT_S)
        assert answer["placement"]["state"] == "active", answer
        return answer["placement"]

    def local_workers(self) -> list[str]:
        folder = Path(self.gateway.state_dir) / "local-workers"
        return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


async def burst(clients: list[GatewayClient], method: str, params: dict[str, Any]) -> list[tuple[str, Any]]:
    """Every client sends the same request at once: ``("ok", placement state)`` or ``(code, message)`` each."""

    async def one(client: GatewayClient) -> tuple[str, Any]:
        try:
            return "ok", (await client.request(method, params, timeout=TIMEOUT_S))["placement"]["state"]
        except GatewayError as error:
            return error.code, error.message

    return await asyncio.gather(*(one(client) for client in clients))


def refusals(answers: list[tuple[str, Any]]) -> set[str]:
    return {message for code, message in answers if code != "ok"}


def assert_settled(session_key: str, *, attached: int = 0) -> list[WorkerEnvironment]:
    """One linear history; the environments the session had: all torn down but ``attached`` (the one it runs on);
    no move intent left."""
    session = Session.objects.get(key=session_key)
    history = PlacementHistory.objects.filter(session=session).order_by("id")
    assert_linear(list(history.values_list("from_state", "to_state", "generation")))
    environment_ids = set(history.exclude(environment_id="").values_list("environment_id", flat=True))
    environments = list(WorkerEnvironment.objects.filter(environment_id__in=environment_ids))
    live = [e for e in environments if e.state not in ("destroyed", "failed")]
    assert len(live) == attached, [(e.pk, e.state, e.last_error) for e in environments]
    assert all(e.state == "attached" and e.destroy_requested_at_ms is None for e in live)
    assert not PlacementMove.objects.filter(session=session).exists()
    return live


def assert_linear(rows: list[tuple[str, str, int]]) -> None:
    """Each row leaves the state the one before entered, one generation on (a repeated failure: failed → failed
    at the same generation, with its new reason only)."""
    state, generation = "", -1
    for from_state, to_state, at in rows:
        repeat = from_state == to_state == state == "failed" and at == generation
        assert repeat or (from_state, at) == (state, generation + 1), rows
        state, generation = to_state, at


def assert_no_node_host_left(rig: Rig) -> None:
    assert rig.local_workers() == []
    assert not PairedDevice.objects.filter(is_node=True, display_name__startswith="local worker").exists()


def test_identical_moves_join_the_one_move(rig):
    async def scenario(size: int) -> tuple[str, list[tuple[str, Any]]]:
        admin, *clients = await rig.connect(size + 1)
        try:
            key = await rig.session(admin, f"moves-{size}")
            placement = await rig.dispatched(admin, key)
            return key, await burst(clients, "sessions.move", move_back_params(key, placement))
        finally:
            await asyncio.gather(*(client.close() for client in [admin, *clients]))

    for size in SIZES:
        key, answers = asyncio.run(scenario(size))
        session_id = Session.objects.get(key=key).session_id
        # Joined calls answer the move's outcome; one that came after the move was over is refused as stale.
        assert ("ok", "local") in answers
        assert refusals(answers) <= {
            f"Cannot move stale worker placement for session {session_id}",
            "session cannot move from placement local",
        }, answers
        assert {code for code, _ in answers} <= {"ok", "INVALID_REQUEST"}
        assert Placement.objects.get(session__key=key).state == "local"
        assert_settled(key)
        assert_no_node_host_left(rig)


def test_identical_dispatches_join_the_one_dispatch(rig):
    async def scenario(size: int) -> tuple[str, list[tuple[str, Any]], dict[str, Any]]:
        admin, *clients = await rig.connect(size + 1)
        try:
            key = await rig.session(admin, f"dispatches-{size}")
            answers = await burst(clients, "sessions.dispatch", {"key": key, "profileId": PROFILE})
            nodes = (await admin.request("node.list", {}))["nodes"]
            return key, answers, next(n for n in nodes if n.get("displayName", "").startswith("local-worker-"))
        finally:
            await asyncio.gather(*(client.close() for client in [admin, *clients]))

    async def move_back(key: str) -> None:
        client = operator(rig.gateway)
        await client.connect()
        try:
            described = await client.request("sessions.describe", {"key": key})
            await client.request("sessions.move", move_back_params(key, described["session"]["placement"]), timeout=60)
        finally:
            await client.close()

    for size in SIZES:
        key, answers, node = asyncio.run(scenario(size))
        assert ("ok", "active") in answers
        # A call after the dispatch settled is refused; the others joined it and answer its outcome.
        assert refusals(answers) <= {"session cannot dispatch from placement active"}, answers
        (environment,) = assert_settled(key, attached=1)
        assert len(rig.local_workers()) == 1
        assert node["connected"] is True
        assert node["workerSlots"]["available"] == node["workerSlots"]["total"] == 2
        asyncio.run(move_back(key))
        assert_settled(key)
        assert WorkerEnvironment.objects.get(pk=environment.pk).state == "destroyed"
        assert_no_node_host_left(rig)


def test_identical_reclaims_and_recoveries_to_the_gateway_have_one_winner(rig):
    async def scenario(size: int, recover: bool) -> tuple[str, list[tuple[str, Any]]]:
        admin, *clients = await rig.connect(size + 1)
        try:
            key = await rig.session(admin, f"{'recover' if recover else 'reclaim'}-{size}")
            placement = await rig.dispatched(admin, key)
            params: dict[str, Any] = {"key": key}
            if recover:
                # The worker is given up (its environment still up): "Continue on Gateway" for that generation.
                failed = await asyncio.to_thread(give_up, key, placement)
                params["recoverToGateway"] = {"expectedGeneration": failed}
            return key, await burst(clients, "sessions.reclaim", params)
        finally:
            await asyncio.gather(*(client.close() for client in [admin, *clients]))

    for recover in (False, True):
        for size in SIZES:
            key, answers = asyncio.run(scenario(size, recover))
            session_id = Session.objects.get(key=key).session_id
            settled = "local" if recover else "reclaimed"
            assert answers.count(("ok", settled)) == 1, answers
            placement = Placement.objects.get(session__key=key)
            assert placement.state == settled
            if recover:
                # Each loser read the failed generation and lost its compare-and-set, or came after.
                assert all(
                    message.startswith(f"Worker session placement {session_id} changed")
                    for message in refusals(answers)
                ), answers
            else:
                assert refusals(answers) <= {
                    f"Cannot drain stale worker placement for session {session_id}",
                    f"Session {key} cannot stop cloud worker from placement draining",
                    f"Session {key} cannot stop cloud worker from placement reconciling",
                    f"Session {key} cannot stop cloud worker from placement reclaimed",
                }, answers
            assert {code for code, _ in answers} <= {"ok", "INVALID_REQUEST"}
            assert_settled(key)
            assert_no_node_host_left(rig)


def give_up(key: str, placement: dict[str, Any]) -> int:
    """Fail the active placement as its worker's loss would (its environment stays up); its new generation."""
    try:
        failed = store.placement_fail_owned(
            session=Session.objects.get(key=key),
            environment_id=placement["environmentId"],
            owner_epoch=placement["activeOwnerEpoch"],
            expected_generation=placement["generation"],
            recovery_error="burst test: the worker was given up",
            actor=Actor("test"),
        )
        return failed.generation
    finally:
        connection.close()  # this thread's: the test database is dropped at the end of the run
