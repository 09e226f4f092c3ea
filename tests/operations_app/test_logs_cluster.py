"""The logs of the deployable topology (``manage.py cluster``): every program writes JSON lines, named after it,
into the one shared log file, and ``logs.tail`` through the balancer reads the lines of every process."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from tests.support.clients import operator
from tests.support.processes import gateway_settings_for_tests, start_cluster

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.redis,
    pytest.mark.slow,
    # Both databases: the cluster's programs open the harness database too (as tests/e2e/test_cluster.py).
    pytest.mark.django_db(transaction=True, databases="__all__"),
]

HAPROXY = os.environ.get("OPENCLAW_HAPROXY", "/usr/sbin/haproxy")


@pytest.fixture
def haproxy():
    if not os.access(HAPROXY, os.X_OK):
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(f"CI: HAProxy ({HAPROXY}) is missing")
        pytest.skip(f"HAProxy ({HAPROXY}) is missing")


def test_every_program_logs_json_lines_named_after_it_into_the_shared_file(haproxy, remove_when_done):
    settings = {
        **gateway_settings_for_tests(os.getpid()),
        # A model that is not there: the turn fails in the Celery worker, which logs why.
        "OPENCLAW_MODEL_BASE_URL": "http://127.0.0.1:9/v1",
        "OPENCLAW_MODEL_CONNECT_TIMEOUT_S": "1",
    }
    cluster = start_cluster(settings, extra_args=("--no-migrate", "--no-restart"))
    remove_when_done(cluster.state_dir)

    async def scenario():
        clients = [operator(cluster) for _ in range(4)]
        for client in clients:
            await client.connect()
        await clients[0].request("sessions.create", {"key": "agent:main:logged"})
        sent = await clients[0].request(
            "chat.send", {"sessionKey": "agent:main:logged", "message": "hello", "idempotencyKey": "r1"}
        )
        waited = await clients[1].request("agent.wait", {"runId": sent["runId"], "timeoutMs": 30_000}, timeout=35)
        # Until the worker's line is in the file (it is written once the failure commits).
        for _ in range(100):
            tail = await clients[2].request("logs.tail", {"limit": 5000, "maxBytes": 1_000_000})
            if any('"turn r1 failed' in line for line in tail["lines"]):
                break
            await asyncio.sleep(0.1)
        for client in clients:
            await client.close()
        return waited, tail

    try:
        waited, tail = asyncio.run(scenario())
    finally:
        cluster.stop()

    assert waited["status"] == "error"
    log_file = Path(cluster.state_dir) / "logs" / "gateway.log"
    assert tail["file"] == str(log_file)
    lines = [json.loads(line) for line in log_file.read_text(encoding="utf-8").splitlines()]
    processes = {line["process"] for line in lines}
    assert "worker-1" in processes and {"gateway-1", "gateway-2"} & processes
    (failed,) = [line for line in lines if line["message"].startswith("turn r1 failed")]
    assert (failed["process"], failed["run_id"], failed["session_key"]) == ("worker-1", "r1", "agent:main:logged")
    tailed = [json.loads(line) for line in tail["lines"]]
    assert {line["process"] for line in tailed} >= {"worker-1"} and failed in tailed
    # Standard error is JSON too under the cluster (OPENCLAW_LOG_FORMAT defaults to json there).
    assert '"logger": "openclaw.access.rpc"' in cluster.log()
