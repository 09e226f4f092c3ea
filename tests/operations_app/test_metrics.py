"""``/metrics``: who may scrape it, what the state collector reads from the database, and the sums over processes
that the cluster's multiprocess mode gives."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import timedelta

import pytest
from django.db import OperationalError, connection
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from approvals_app.services import approvals
from devices_app.models import DevicePairingRequest
from gateway.models import GatewayConnection, GatewayProcess
from openclaw_site.supervision import forget_live_metrics
from operations_app import metrics as operations_metrics
from operations_app.metrics import scrape_registry
from sessions_app.services import runs, sessions
from tests.approvals_app.conftest import ask
from workers_app.models import NodeWorkerHost
from workers_app.services import placements

pytestmark = pytest.mark.django_db

TOKEN = "metrics-token-0123456789"
FOREIGN = "203.0.113.9"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(scraped: dict, name: str, **labels: str) -> float | None:
    return scraped.get((name, tuple(sorted(labels.items()))))


def scrape() -> dict:
    return samples(generate_latest(scrape_registry()).decode("utf-8"))


# --- who may scrape -------------------------------------------------------------------------------


def test_a_loopback_client_scrapes_without_a_token(client):
    response = client.get("/metrics")

    assert response.status_code == 200
    assert response["Content-Type"] == CONTENT_TYPE_LATEST
    scraped = samples(response.content.decode("utf-8"))
    assert value(scraped, "openclaw_state_source_up", source="database") == 1


def test_a_foreign_client_is_refused_without_a_token(client):
    response = client.get("/metrics", REMOTE_ADDR=FOREIGN)

    assert response.status_code == 403
    assert response.content.decode() == (
        "forbidden: /metrics answers loopback clients only; set OPENCLAW_METRICS_TOKEN to scrape it from elsewhere "
        "with Authorization: Bearer <token>\n"
    )


def test_a_proxied_loopback_client_counts_as_foreign(client):
    """Through HAProxy every client comes from 127.0.0.1: the proxy's headers show it is not local."""
    response = client.get("/metrics", HTTP_X_FORWARDED_FOR=FOREIGN)
    assert response.status_code == 403


def test_with_a_token_set_everyone_needs_it_loopback_included(client, settings):
    settings.OPENCLAW_METRICS_TOKEN = TOKEN

    missing = client.get("/metrics")
    wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer not-the-token")
    other_scheme = client.get("/metrics", HTTP_AUTHORIZATION=f"Basic {TOKEN}")
    right_local = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    right_foreign = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}", REMOTE_ADDR=FOREIGN)

    assert missing.status_code == wrong.status_code == other_scheme.status_code == 401
    assert missing["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert missing.content.decode() == (
        "unauthorized: metrics token missing (send Authorization: Bearer <OPENCLAW_METRICS_TOKEN>)\n"
    )
    assert wrong.content.decode() == (
        "unauthorized: metrics token mismatch (send Authorization: Bearer <OPENCLAW_METRICS_TOKEN>)\n"
    )
    assert TOKEN not in wrong.content.decode()
    assert right_local.status_code == right_foreign.status_code == 200


def test_metrics_switched_off_answer_404(client, settings):
    settings.OPENCLAW_METRICS_ENABLED = False
    assert client.get("/metrics").status_code == 404


def test_only_get_is_served(client):
    assert client.post("/metrics").status_code == 405


# --- the state read at scrape time ----------------------------------------------------------------


@pytest.fixture
def no_dispatch(monkeypatch):
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: None)


def _node_declaring_slots(total: int, available: int) -> None:
    process = GatewayProcess.objects.create(
        boot_id=uuid.uuid4(), hostname="h", pid=1, started_at=timezone.now(), heartbeat_at=timezone.now()
    )
    conn_id = uuid.uuid4()
    GatewayConnection.objects.create(
        conn_id=conn_id,
        process=process,
        channel_name="inmemory!n",
        role="node",
        auth_method="device-token",
        node_id="node-1",
        client_id="node-host",
        client_mode="node",
        connected_at=timezone.now(),
    )
    NodeWorkerHost.objects.create(
        node_id="node-1",
        conn_id=str(conn_id),
        worker_host={"enabled": True, "capacity": {"total": total, "available": available}},
        updated_at_ms=1,
    )


def test_the_collector_reports_the_state_of_the_database(no_dispatch):
    busy = sessions.session_create(spec=sessions.SessionSpec(key="agent:main:busy", agent_id="main"))
    runs.run_submit(session_key=busy.key, message="first", idempotency_key="r1")
    runs.run_submit(session_key=busy.key, message="second", idempotency_key="r2")
    assert runs.run_claim(run_id="r1", executor="gateway:test") is not None
    placed = sessions.session_create(spec=sessions.SessionSpec(key="agent:main:placed", agent_id="main"))
    placements.placement_start_dispatch(session=placed)
    DevicePairingRequest.objects.create(
        device_id="d" * 64,
        public_key="k",
        role="operator",
        reason="new",
        expires_at=timezone.now() + timedelta(minutes=5),
    )
    DevicePairingRequest.objects.create(
        device_id="e" * 64,
        public_key="k",
        role="operator",
        reason="new",
        expires_at=timezone.now() - timedelta(minutes=1),
    )
    approvals.exec_approval_request(**ask())
    _node_declaring_slots(total=4, available=1)

    scraped = scrape()

    assert value(scraped, "openclaw_runs", status="queued") == 1
    assert value(scraped, "openclaw_runs", status="running") == 1
    assert value(scraped, "openclaw_oldest_running_run_age_seconds") >= 0
    assert value(scraped, "openclaw_placements", state="requested") == 1
    assert value(scraped, "openclaw_placements", state="active") == 0
    assert value(scraped, "openclaw_nodes_connected") == 1
    assert value(scraped, "openclaw_worker_slots", state="busy") == 3
    assert value(scraped, "openclaw_worker_slots", state="free") == 1
    assert value(scraped, "openclaw_pairing_requests_pending") == 1  # the expired one is not waiting
    assert value(scraped, "openclaw_exec_approvals_pending") == 1
    assert value(scraped, "openclaw_state_source_up", source="database") == 1


def test_an_empty_gateway_reports_zeros():
    scraped = scrape()

    assert value(scraped, "openclaw_runs", status="queued") == 0
    assert value(scraped, "openclaw_runs", status="running") == 0
    assert value(scraped, "openclaw_oldest_running_run_age_seconds") == 0
    assert value(scraped, "openclaw_worker_slots", state="busy") == 0
    assert value(scraped, "openclaw_pairing_requests_pending") == 0


def test_the_collector_reads_in_a_few_queries(django_assert_max_num_queries):
    with django_assert_max_num_queries(8):
        scrape()


def test_without_a_broker_there_is_no_queue_depth(settings):
    settings.OPENCLAW_TASK_MODE = "inprocess"
    scraped = scrape()
    assert not any(name == "openclaw_celery_queue_depth" for name, _labels in scraped)
    assert value(scraped, "openclaw_state_source_up", source="broker") is None


def test_the_queue_depth_comes_from_the_broker(settings):
    if not settings.REDIS_URL:
        pytest.skip("needs REDIS_URL (the Celery broker)")
    settings.OPENCLAW_TASK_MODE = "celery"
    scraped = scrape()
    assert value(scraped, "openclaw_state_source_up", source="broker") == 1
    assert value(scraped, "openclaw_celery_queue_depth", queue=settings.CELERY_TASK_DEFAULT_QUEUE) >= 0


def test_an_unreachable_broker_leaves_the_rest_of_the_scrape(settings, caplog):
    settings.OPENCLAW_TASK_MODE = "celery"
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:9/0"  # discard port: nothing listens

    scraped = scrape()

    assert value(scraped, "openclaw_state_source_up", source="broker") == 0
    assert value(scraped, "openclaw_state_source_up", source="database") == 1
    assert value(scraped, "openclaw_runs", status="queued") == 0
    assert "reading the Celery queue depth from the broker failed" in caplog.text


def test_a_failing_database_leaves_the_counters_and_says_so(monkeypatch, caplog):
    def database_gone():
        raise OperationalError("connection refused")

    monkeypatch.setattr(operations_metrics, "database_state", database_gone)

    scraped = scrape()

    assert value(scraped, "openclaw_state_source_up", source="database") == 0
    assert not any(name == "openclaw_runs" for name, _labels in scraped)
    assert value(scraped, "openclaw_gateway_slow_consumer_disconnects_total") is not None
    assert "reading the gateway's state from the database failed" in caplog.text


# --- several processes (the cluster's multiprocess mode) ------------------------------------------

RECORDING_PROCESS = """
import django, os, sys
django.setup()
from gateway import metrics
for _ in range(int(sys.argv[1])):
    metrics.record_rpc_call("health", "ok", 0.001)
metrics.connection_opened("operator")
print(os.getpid())
"""


def _recording_process(multiprocess_dir, calls: int) -> int:
    result = subprocess.run(
        [sys.executable, "-c", RECORDING_PROCESS, str(calls)],
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(multiprocess_dir)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(result.stdout.strip().splitlines()[-1])


def test_the_processes_of_a_cluster_are_summed(tmp_path, monkeypatch):
    first = _recording_process(tmp_path, 3)
    second = _recording_process(tmp_path, 4)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))

    scraped = scrape()

    assert value(scraped, "openclaw_rpc_duration_seconds_count", method="health", outcome="ok") == 7
    assert value(scraped, "openclaw_rpc_duration_seconds_bucket", method="health", outcome="ok", le="+Inf") == 7
    # Both recording processes have exited: the console marks them dead, and their connections stop counting.
    assert value(scraped, "openclaw_gateway_connections", role="operator") == 2
    forget_live_metrics(str(first))
    forget_live_metrics(str(second))
    after = scrape()
    assert value(after, "openclaw_gateway_connections", role="operator") is None
    assert value(after, "openclaw_rpc_duration_seconds_count", method="health", outcome="ok") == 7


def test_the_pool_gauge_reads_psycopg_pool_stats_through_the_connections_pool_property():
    """Pins the one undocumented (but public) attribute /metrics reads on the locked Django: the PostgreSQL
    connection's ``pool`` (docs/architecture.md, "Supported APIs only")."""
    stats = operations_metrics.database_pool_stats()
    if connection.vendor != "postgresql":
        assert stats is None
        return
    assert {"pool_size", "pool_available"} <= set(stats)
    assert stats["pool_size"] >= stats["pool_available"] >= 0
