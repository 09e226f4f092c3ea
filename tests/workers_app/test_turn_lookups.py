"""The hand-written reads on a node turn's path answer what the ORM queries they replaced answered.

``node_turn_place``: a run's node, environment and the node's live connection (of a live process;
a node has at most one connection). ``granted_run``: the run while it runs on an active placement on that node.
Run on both backends (raw rows differ: JSON, UUIDs and datetimes are text on SQLite).
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from gateway.invoke import invoke_target
from gateway.models import GatewayConnection, GatewayProcess
from sessions_app.models import Run
from tests.workers_app.test_inference_proxy import ENVIRONMENT, NODE, OTHER_NODE, placed_session, running, submitted
from workers_app.models import Placement, WorkerEnvironment
from workers_app.nodes.turn_lookups import NodeRoute, granted_run, node_turn_place

pytestmark = pytest.mark.django_db

COMMANDS = ["worker.launch.v1", "worker.cancel.v1"]


def live_process(boot_id: str | None = None, *, stale: bool = False) -> GatewayProcess:
    now = timezone.now()
    heartbeat = now - timedelta(hours=1) if stale else now
    return GatewayProcess.objects.create(
        boot_id=boot_id or str(uuid.uuid4()), hostname="h", pid=1, started_at=now, heartbeat_at=heartbeat
    )


def node_connection(process: GatewayProcess, *, node_id: str = NODE, conn_id: str | None = None) -> GatewayConnection:
    return GatewayConnection.objects.create(
        conn_id=conn_id or str(uuid.uuid4()),
        process=process,
        channel_name=f"specific.{process.boot_id}!{uuid.uuid4().hex}",
        role="node",
        scopes=[],
        auth_method="device-token",
        device_id=node_id,
        node_id=node_id,
        client_id="node-host",
        client_mode="node",
        commands=COMMANDS,
        connected_at=timezone.now(),
    )


def test_a_placed_run_finds_its_node_environment_and_the_nodes_live_connection():
    session = placed_session()
    run = submitted(session)
    connection = node_connection(live_process())

    place = node_turn_place(run.run_id)

    assert place is not None
    assert (place.node_id, place.environment_id) == (NODE, ENVIRONMENT)
    assert place.lease_id == f"device:{NODE}:op"
    assert place.session_id == session.session_id
    assert place.bundle_hash == WorkerEnvironment.objects.get(pk=ENVIRONMENT).bootstrap_bundle_hash
    assert place.route == NodeRoute(
        connection.channel_name, str(connection.conn_id), COMMANDS, process_id=str(connection.process_id)
    )
    # The same connection the invoke's own lookup picks.
    target = invoke_target(NODE)
    assert (target.channel_name, target.conn_id, target.commands) == (
        place.route.channel_name,
        place.route.conn_id,
        place.route.commands,
    )


def test_a_node_without_a_live_connection_has_no_route():
    run = submitted(placed_session())
    node_connection(live_process(stale=True))  # its process stopped heartbeating
    node_connection(live_process(), node_id=OTHER_NODE)  # another node's

    place = node_turn_place(run.run_id)

    assert place is not None and place.node_id == NODE
    assert place.route is None and invoke_target(NODE) is None


def test_a_run_whose_session_is_not_placed_on_a_node_runs_here():
    session = placed_session()
    run = submitted(session)
    Placement.objects.filter(pk=session.pk).update(state="draining")

    assert node_turn_place(run.run_id) is None
    assert node_turn_place("no-such-run") is None


def test_a_grant_holds_while_its_run_runs_on_an_active_placement_on_its_node():
    run = running(placed_session())

    granted = granted_run(run.run_id, NODE)

    assert granted is not None
    assert granted.run.run_id == run.run_id
    assert granted.run.started_at == Run.objects.get(pk=run.pk).started_at
    assert granted.session_model == run.session.model


def test_a_grant_does_not_hold_for_another_node_a_finished_run_or_a_moved_placement():
    session = placed_session()
    run = running(session)

    assert granted_run(run.run_id, OTHER_NODE) is None
    assert granted_run("no-such-run", NODE) is None
    Placement.objects.filter(pk=session.pk).update(state="draining")
    assert granted_run(run.run_id, NODE) is None
    Placement.objects.filter(pk=session.pk).update(state="active")
    Run.objects.filter(pk=run.pk).update(status="ok")
    assert granted_run(run.run_id, NODE) is None
