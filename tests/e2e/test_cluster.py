"""The deployable topology, started as documented (``manage.py cluster``, what ``./dev cluster`` runs): HAProxy in
front of two gateway processes, a Celery worker and beat, on the test run's PostgreSQL + Redis.

Clients connect through the balancer only and land on different processes (the ``bootId`` of hello-ok); a turn, a
``node.invoke`` and a dispatched session's turn on the project's node host work across them; one gateway process is
killed with SIGKILL mid-traffic: nothing committed is lost, the reconnecting client and the node host come back through
HAProxy on the other process and resume (subscription, retried ``agent.wait``), and the node turn that was running
through the killed process ends with a clear reason. Once more with RabbitMQ as the Celery broker. ``/metrics``
through the balancer counts the calls of both gateway processes and the tasks of the Celery worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import kombu
import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from prometheus_client.parser import text_string_to_metric_families

from gateway.models import GatewayConnection, GatewayProcess
from openclaw_client.client import ConnectError
from tests.e2e.test_node_invoke import node_commands
from tests.e2e.test_seed_004_paired_node_worker_lifecycle import (
    Wire,
    model_env,
    node_id_of,
    publish_workspace,
    wait_connected,
)
from tests.support.clients import call_once, node, operator
from tests.support.processes import gateway_settings_for_tests, start_cluster, start_node_host

# Both databases: the gateways open the harness store too, and their readiness checks its migrations.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases="__all__"),
]

HAPROXY = os.environ.get("OPENCLAW_HAPROXY", "/usr/sbin/haproxy")
RABBITMQ_URL = os.environ.get("OPENCLAW_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")
# A killed process is known dead within seconds (the pid check notices it at once on this host).
FAST_LEASES = {"OPENCLAW_PROCESS_HEARTBEAT_INTERVAL_MS": "500", "OPENCLAW_PROCESS_STALE_AFTER_MS": "3000"}


def _ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def _require(available: bool, what: str) -> None:
    """CI runs every test (``./dev test`` installs HAProxy, ``.ci/run`` starts RabbitMQ); elsewhere a missing tool
    leaves its test out."""
    if available:
        return
    if _ci():
        pytest.fail(f"CI: {what} is missing")
    pytest.skip(f"{what} is missing")


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def haproxy():
    _require(os.access(HAPROXY, os.X_OK), f"HAProxy ({HAPROXY})")


def cluster_settings(extra: dict[str, str]) -> dict[str, str]:
    """The test databases and Redis prefix, one Celery queue for this cluster, fast process leases."""
    port_tag = os.getpid()
    return {
        **gateway_settings_for_tests(port_tag),
        # Beat's sweeps are part of the topology under test.
        "OPENCLAW_SWEEP_INTERVAL_MS": "15000",
        **FAST_LEASES,
        **extra,
    }


def readiness_through_the_balancer(cluster) -> dict:
    """``/readyz`` as HAProxy's checks ask it (docs/operations.md "Health"), through the balancer, once the gateway has
    seen the cluster's Celery workers on its turn queue (its check of them refreshes on its own thread, every 15 s;
    the workers start after the gateways), or as it stands after a minute."""
    deadline = time.monotonic() + 60
    while True:
        with urllib.request.urlopen(f"{cluster.http_url}/readyz", timeout=10) as answer:
            assert answer.status == 200
            body = json.loads(answer.read())
        if body["checks"].get("taskWorkers", {}).get("state") == "ok" or time.monotonic() > deadline:
            return body
        time.sleep(1)


def assert_ready_with_every_dependency(body: dict) -> None:
    assert body["status"] == "ready", body
    assert {name: check["state"] for name, check in body["checks"].items()} == {
        "startup": "ok",
        "database": "ok",
        "channelLayer": "ok",
        "broker": "ok",
        "migrations": "ok",
        "taskWorkers": "ok",
    }, body
    assert body["checks"]["channelLayer"]["reason"] == "redis"


def closing_its_connection(read: Callable[[str], Any]) -> Callable[[str], Any]:
    """A read for ``sync_to_async`` under ``asyncio.run``: asgiref runs it on a thread that outlives the test, whose
    connection would keep the test database from being dropped (and, on PostgreSQL, a pool connection taken)."""

    def read_and_close(argument: str) -> Any:
        try:
            return read(argument)
        finally:
            connections.close_all()

    return read_and_close


@closing_its_connection
def boot_of_node(node_id: str) -> str:
    return str(GatewayConnection.objects.get(role="node", node_id=node_id).process_id)


@closing_its_connection
def pid_of_boot(boot_id: str) -> int:
    return GatewayProcess.objects.get(boot_id=boot_id).pid


def test_clients_spread_over_processes_and_survive_one_being_killed(haproxy, mock_openai, tmp_path, remove_when_done):
    workspace_root = tmp_path / "allowed"
    workspace_root.mkdir()
    published = publish_workspace(workspace_root)
    cluster = start_cluster(
        cluster_settings(model_env(mock_openai, workspace_root)), extra_args=("--no-migrate", "--no-restart")
    )
    remove_when_done(cluster.state_dir)
    node_host = start_node_host(cluster, capacity=2, capacity_wait_ms=500, gateway_url=cluster.url)
    remove_when_done(node_host.state_dir)
    try:
        readiness = readiness_through_the_balancer(cluster)
        haproxy_config = (Path(cluster.state_dir) / "cluster" / "haproxy.cfg").read_text()
        gateway_file = json.loads((Path(cluster.state_dir) / "gateway.json").read_text())
        # The CLI finds the cluster without --url, at the balancer (the backends write no gateway.json).
        with socket.create_server(("127.0.0.1", 0)) as nobody:
            unused_port = nobody.getsockname()[1]
        cli_env = {key: value for key, value in cluster.env.items() if not key.startswith("OPENCLAW_GATEWAY_")}
        found = subprocess.run(
            [sys.executable, "-m", "openclaw_client", "call", "health"],
            env={
                **cli_env,
                "OPENCLAW_STATE_DIR": cluster.state_dir,
                "OPENCLAW_GATEWAY_TOKEN": cluster.token,
                "OPENCLAW_GATEWAY_PORT": str(unused_port),
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
        call_once(cluster, "node.pair.approve", {"requestId": node_host.pairing_request()})
        outcome = asyncio.run(scenario(cluster, node_host, mock_openai, published))
    finally:
        mock_openai.release()
        node_host.stop()
        cluster.stop()
    log = cluster.log()
    (
        boots,
        killed_boot,
        survivor_boot,
        local_before,
        invoked,
        node_turn,
        reconnected_boots,
        held_local,
        interrupted,
        history,
        listed_keys,
        node_turn_after,
        invoked_after,
    ) = outcome

    # HAProxy checks the gateways' readiness, and through it a client sees them ready on every dependency.
    assert "http-check send meth GET uri /readyz " in haproxy_config
    assert (gateway_file["port"], gateway_file["url"]) == (cluster.port, cluster.url), gateway_file
    assert found.returncode == 0 and json.loads(found.stdout)["ok"] is True, found.stderr
    assert_ready_with_every_dependency(readiness)
    # Through one balancer, the clients landed on both processes.
    assert len(set(boots.values())) == 2, boots
    assert local_before["status"] == "ok" and invoked["payload"] == {"echoed": {"from": "cluster"}}
    assert node_turn["status"] == "ok"
    # After the kill, the reconnecting client resumed on the surviving process.
    assert reconnected_boots[0] == killed_boot and reconnected_boots[-1] == survivor_boot
    # The local turn ran in the Celery worker: the gateway's death did not touch it; the retried wait got its end.
    assert held_local["status"] == "ok", held_local
    # The node turn whose node connection was on the killed process ended with a reason that says so.
    assert interrupted["status"] == "error", interrupted
    assert interrupted["error"] == (
        "device worker turn interrupted: the gateway process holding the node's connection stopped mid-turn; "
        "the node reconnects through another process, retry the turn (runner-offline)"
    ), interrupted
    # Nothing committed was lost: the turn before the kill is in the transcript, every session still listed.
    assert any(m.get("role") == "assistant" for m in history), history
    assert {"agent:main:cluster-local", "agent:qa:paired-node-worker-lifecycle:node"} <= set(listed_keys)
    assert node_turn_after["status"] == "ok" and invoked_after["payload"] == {"echoed": {"from": "after"}}
    assert "Traceback" not in node_host.log(), node_host.log()
    assert "ready:" in log


async def scenario(cluster, node_host, mock, published: Path):
    admin = operator(cluster)
    await admin.connect()
    wire = Wire(admin, published)
    node_id = node_id_of(node_host)
    await wait_connected(wire, node_id)

    # The test's own node (for node.invoke), kept connected by the client's reconnecting runner.
    stop = asyncio.Event()
    invoker = node(cluster, invoke_handler=node_commands)
    invoker_boots: list[str] = []

    async def invoker_connected(client):
        invoker_boots.append(client.hello["server"]["bootId"])

    with pytest.raises(ConnectError) as refused:
        await invoker.connect()
    await admin.request("node.pair.approve", {"requestId": refused.value.details["requestId"]})
    invoker_task = asyncio.create_task(
        invoker.run_forever(on_connected=invoker_connected, backoff_initial=0.2, stop=stop)
    )
    await until(lambda: invoker_boots)

    node_boot = await sync_to_async(boot_of_node)(node_id)
    # An operator on the node host's process, kept connected by the reconnecting runner; it resubscribes each time.
    watcher_boots: list[str] = []
    watcher = None
    extras = []
    for _attempt in range(4):
        candidate = operator(cluster)
        probe = asyncio.Event()

        async def connected(client, probe=probe):
            watcher_boots.append(client.hello["server"]["bootId"])
            await client.request("sessions.subscribe", {})
            probe.set()

        task = asyncio.create_task(candidate.run_forever(on_connected=connected, backoff_initial=0.2, stop=stop))
        await asyncio.wait_for(probe.wait(), 30)
        if watcher_boots[-1] == node_boot:
            watcher, watcher_task = candidate, task
            break
        # leastconn sends the next connection to the less busy process: this one stays open meanwhile.
        watcher_boots.clear()
        extras.append((candidate, task))
    assert watcher is not None, "no connection landed on the node host's process"
    boots = {"admin": admin.hello["server"]["bootId"], "node-host": node_boot, "invoker": invoker_boots[-1]}
    boots["watcher"] = watcher_boots[-1]

    # Work across processes: a local turn, a node.invoke, a dispatch and a node turn.
    local_key = "agent:main:cluster-local"
    await admin.request("sessions.create", {"key": local_key})
    run_id = await wire.start_turn(local_key, "LOCAL-BEFORE")
    local_before = await watcher.request("agent.wait", {"runId": run_id, "timeoutMs": 30_000}, timeout=35)
    caller = admin if boots["admin"] != boots["invoker"] else watcher
    invoked = await caller.request(
        "node.invoke",
        {"nodeId": invoker.device_id, "command": "echo", "params": {"from": "cluster"}, "idempotencyKey": "c1"},
    )
    node_key = await wire.create_session("node")
    await wire.dispatch_node_session(node_key, node_id)
    node_run = await wire.start_turn(node_key, "NODE-BEFORE")
    node_turn = await wire.wait_for_turn(node_run)

    # Mid-traffic: a local turn and a node turn both waiting on the model; then SIGKILL the node host's process.
    mock.hold("HELD-LOCAL", "HELD-NODE")
    held_local_id = await wire.start_turn(local_key, "HELD-LOCAL")
    held_node_id = await wire.start_turn(node_key, "HELD-NODE")
    await until(lambda: set(mock.held()) == {"HELD-LOCAL", "HELD-NODE"})
    survivor_boot = next(b for b in boots.values() if b != node_boot)
    killed_pid = await sync_to_async(pid_of_boot)(node_boot)
    cluster.kill(killed_pid)

    # The watcher and the node host come back through HAProxy, on the surviving process.
    await until(lambda: len(watcher_boots) >= 2)
    await asyncio.to_thread(node_host.wait_connects, 2, 30)
    await wait_connected(wire, node_id)
    assert await sync_to_async(boot_of_node)(node_id) == survivor_boot
    # The node turn that ran through the killed process is ended (the local one keeps waiting on the model).
    interrupted = await watcher.request("agent.wait", {"runId": held_node_id, "timeoutMs": 60_000}, timeout=65)
    mock.release()
    # Retried on the new connection: agent.wait is idempotent.
    held_local = await watcher.request("agent.wait", {"runId": held_local_id, "timeoutMs": 30_000}, timeout=35)
    history = await wire.history(local_key)
    listed = await watcher.request("sessions.list", {})
    listed_keys = [row["key"] for row in listed["sessions"]]
    node_run_after = await wire.start_turn(node_key, "NODE-AFTER")
    node_turn_after = await wire.wait_for_turn(node_run_after)
    await until(lambda: invoker_boots[-1] == survivor_boot)
    invoked_after = await watcher.request(
        "node.invoke",
        {"nodeId": invoker.device_id, "command": "echo", "params": {"from": "after"}, "idempotencyKey": "c2"},
    )
    stop.set()
    tasks = [invoker_task, watcher_task, *(task for _client, task in extras)]
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 15)
    await admin.close()
    return (
        boots,
        node_boot,
        survivor_boot,
        local_before,
        invoked,
        node_turn,
        watcher_boots,
        held_local,
        interrupted,
        history,
        listed_keys,
        node_turn_after,
        invoked_after,
    )


async def until(predicate, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.05)


def test_the_topology_with_rabbitmq_as_the_celery_broker(haproxy, remove_when_done):
    _require(_reachable("127.0.0.1", 5672), "RabbitMQ (127.0.0.1:5672)")
    settings = cluster_settings({"CELERY_BROKER_URL": RABBITMQ_URL})
    cluster = start_cluster(settings, extra_args=("--no-migrate", "--no-restart"))
    remove_when_done(cluster.state_dir)

    async def scenario_rabbitmq():
        first, second = operator(cluster), operator(cluster)
        await first.connect()
        await second.connect()
        await first.request("sessions.create", {"key": "agent:main:rabbit"})
        sent = await first.request(
            "chat.send", {"sessionKey": "agent:main:rabbit", "message": "over amqp", "idempotencyKey": "r1"}
        )
        waited = await second.request("agent.wait", {"runId": sent["runId"], "timeoutMs": 30_000}, timeout=35)
        boots = {first.hello["server"]["bootId"], second.hello["server"]["bootId"]}
        await first.close()
        await second.close()
        return boots, waited

    try:
        readiness = readiness_through_the_balancer(cluster)
        boots, waited = asyncio.run(scenario_rabbitmq())
    finally:
        cluster.stop()
        # The run's queue is durable on the broker: it would outlive the run.
        with kombu.Connection(RABBITMQ_URL) as broker:
            broker.default_channel.queue_delete(settings["OPENCLAW_CELERY_QUEUE"])
    assert len(boots) == 2
    # The broker the readiness check reached is RabbitMQ here.
    assert_ready_with_every_dependency(readiness)
    assert (waited["status"], waited["outputText"]) == ("ok", "over amqp")
    assert "transport:   amqp://guest:**@127.0.0.1:5672//" in cluster.log()


METRICS_TOKEN = "cluster-metrics-token-0123456789"
STATUS_CALLS_PER_CLIENT = 5


def scrape(cluster, token: str | None = METRICS_TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"{cluster.http_url}/metrics", headers=headers, timeout=15)


def sample_value(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


def scrape_until_turn_task_counted(cluster, timeout: float = 30.0) -> tuple[str, float | None]:
    """The turn's Celery task is counted once it returns, a moment after ``agent.wait`` has its answer."""
    deadline = time.monotonic() + timeout
    while True:
        text = scrape(cluster).text
        counted = sample_value(text, "openclaw_celery_tasks_total", task="sessions.run_turn", outcome="success")
        if counted or time.monotonic() > deadline:
            return text, counted
        time.sleep(0.5)


def test_metrics_through_the_balancer_sum_every_process(haproxy, remove_when_done):
    cluster = start_cluster(
        cluster_settings({"OPENCLAW_METRICS_TOKEN": METRICS_TOKEN}), extra_args=("--no-migrate", "--no-restart")
    )
    remove_when_done(cluster.state_dir)

    async def scenario_metrics():
        clients = [operator(cluster) for _ in range(4)]
        for client in clients:
            await client.connect()
        boots = [client.hello["server"]["bootId"] for client in clients]
        for client in clients:
            for _ in range(STATUS_CALLS_PER_CLIENT):
                await client.request("status", {})
        await clients[0].request("sessions.create", {"key": "agent:main:metrics"})
        sent = await clients[0].request(
            "chat.send", {"sessionKey": "agent:main:metrics", "message": "count me", "idempotencyKey": "m1"}
        )
        waited = await clients[1].request("agent.wait", {"runId": sent["runId"], "timeoutMs": 30_000}, timeout=35)
        while_connected = await asyncio.to_thread(scrape, cluster)
        for client in clients:
            await client.close()
        return boots, waited, while_connected

    try:
        boots, waited, while_connected = asyncio.run(scenario_metrics())
        refused = scrape(cluster, token=None)
        text, turn_tasks = scrape_until_turn_task_counted(cluster)
    finally:
        cluster.stop()

    assert len(set(boots)) == 2, boots  # the clients landed on both processes
    assert waited["status"] == "ok", waited
    assert refused.status_code == 401 and "metrics token missing" in refused.text
    assert while_connected.status_code == 200, while_connected.text
    # Every status call counted, whichever process answered it and whichever process answers the scrape.
    assert sample_value(while_connected.text, "openclaw_rpc_duration_seconds_count", method="status", outcome="ok") == (
        4 * STATUS_CALLS_PER_CLIENT
    )
    assert sample_value(while_connected.text, "openclaw_gateway_connections", role="operator") == 4
    assert sample_value(while_connected.text, "openclaw_state_source_up", source="broker") == 1
    assert turn_tasks is not None and turn_tasks >= 1, text
    assert sample_value(text, "openclaw_turns_total", status="ok") == 1
