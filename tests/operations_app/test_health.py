"""``/healthz`` and ``/readyz``: the readiness checks against real dependencies, reachable or not
(operations_app/health.py)."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Iterator

import pytest
from django.core.cache import cache
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder

from gateway import state, task_consumers
from gateway.task_consumers import UNCONSUMED_SINCE_KEY, ConsumerWatch, worker_missing_message
from operations_app import health
from operations_app.health import CheckResult, CheckState, ReadinessChecks
from tests.support.processes import free_port

# A short deadline keeps the unreachable cases quick; the checks' own timeouts stay as configured.
TEST_TIMEOUT_S = 1.0
# How long a test waits for the broker's answer about the turn queue's workers (the broadcast takes 2 s).
PROBE_WAIT_S = 15.0


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never answers (a dependency that hangs)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for peer in accepted:
        peer.close()
    listener.close()


def redis_layer(address: str) -> dict:
    return {"default": {"BACKEND": health.REDIS_CHANNEL_LAYER, "CONFIG": {"hosts": [{"address": address}]}}}


# The probes run on threads of their own, on every database (the migrations check reads both).
every_database = pytest.mark.django_db(transaction=True, databases="__all__")


# --- the checks -----------------------------------------------------------------------------------


@every_database
def test_a_process_with_its_dependencies_up_is_ready():
    readiness = ReadinessChecks().run()

    assert readiness.ready, readiness.to_json()
    assert set(readiness.checks) == {"startup", "database", "channelLayer", "broker", "migrations", "taskWorkers"}
    assert readiness.checks["database"].state == CheckState.OK
    assert readiness.checks["migrations"].state == CheckState.OK
    assert readiness.to_json()["status"] == "ready"


@every_database
def test_the_in_memory_channel_layer_and_no_broker_are_ready(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.OPENCLAW_TASK_MODE = "inprocess"

    readiness = ReadinessChecks().run()

    assert readiness.ready
    assert readiness.checks["channelLayer"] == CheckResult(
        CheckState.OK, "in-memory", readiness.checks["channelLayer"].duration_ms
    )
    assert readiness.checks["broker"].state == CheckState.NOT_CONFIGURED


@every_database
def test_an_unreachable_redis_makes_the_process_not_ready_without_its_error_text(settings):
    settings.CHANNEL_LAYERS = redis_layer(f"redis://127.0.0.1:{free_port()}/0")

    readiness = ReadinessChecks().run(TEST_TIMEOUT_S)

    assert not readiness.ready
    assert readiness.checks["channelLayer"].state == CheckState.FAILING
    body = readiness.to_json()
    assert body["status"] == "not ready"
    assert body["checks"]["channelLayer"]["state"] == "failing"
    assert body["checks"]["channelLayer"]["reason"] == "unreachable"
    assert "refused" not in json.dumps(body).lower() and "111" not in json.dumps(body)
    assert body["checks"]["database"]["state"] == "ok"


@every_database
def test_a_broker_that_refuses_makes_the_process_not_ready(settings):
    settings.OPENCLAW_TASK_MODE = "celery"
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{free_port()}/0"

    readiness = ReadinessChecks().run(TEST_TIMEOUT_S)

    assert not readiness.ready
    assert readiness.checks["broker"].to_json()["state"] == "failing"
    assert readiness.checks["broker"].reason == "unreachable"


@every_database
def test_a_dependency_that_hangs_is_a_timeout_and_is_not_probed_twice_at_once(settings, silent_server):
    settings.CHANNEL_LAYERS = redis_layer(f"redis://127.0.0.1:{silent_server}/0")
    checks = ReadinessChecks()

    first = checks.run(0.2)
    hanging = checks.checks["channelLayer"].in_flight
    second = checks.run(0.2)

    assert first.checks["channelLayer"].state == CheckState.TIMEOUT
    assert first.checks["channelLayer"].reason == "no answer within 0.2 s"
    assert second.checks["channelLayer"].state == CheckState.TIMEOUT
    # The second call waited for the probe still running instead of starting another one.
    assert checks.checks["channelLayer"].in_flight is hanging
    assert not first.ready and first.checks["database"].state == CheckState.OK
    # Redis's own socket timeout ends the hanging probe: a failure, not a thread left behind for good.
    assert hanging.result(timeout=health.CHECK_TIMEOUT_S + 5).state == CheckState.FAILING


@every_database
def test_unapplied_migrations_are_not_ready_and_once_applied_are_not_checked_again():
    recorder = MigrationRecorder(connection)
    checks = ReadinessChecks()
    recorder.record_unapplied("operations_app", "0001_recorded_error")
    try:
        unready = checks.run()
    finally:
        recorder.record_applied("operations_app", "0001_recorded_error")

    assert unready.checks["migrations"].state == CheckState.FAILING
    assert unready.checks["migrations"].reason == "1 unapplied migrations"
    assert not unready.ready

    assert checks.run().checks["migrations"].state == CheckState.OK
    # Ready once: the expensive plan is not computed again (a migration recorded as missing now goes unseen).
    recorder.record_unapplied("operations_app", "0001_recorded_error")
    try:
        assert checks.run().checks["migrations"].state == CheckState.OK
    finally:
        recorder.record_applied("operations_app", "0001_recorded_error")


def test_a_database_the_test_may_not_use_is_a_failing_check_not_an_error():
    """pytest-django refuses database access here, as a dead server would: the check says so and goes on."""
    readiness = ReadinessChecks().run(TEST_TIMEOUT_S)

    assert readiness.checks["database"].state == CheckState.FAILING
    assert readiness.checks["database"].reason == "unreachable"
    assert readiness.checks["migrations"].reason == "not checked: database error"


# --- the views ------------------------------------------------------------------------------------


def test_healthz_answers_without_the_database(client):
    response = client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert "no-cache" in response["Cache-Control"]


def test_healthz_and_readyz_refuse_writes(client):
    assert client.post("/healthz").status_code == 405
    assert client.post("/readyz").status_code == 405


@every_database
def test_readyz_is_200_when_ready(client):
    response = client.get("/readyz")

    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == "ready"
    assert body["checks"]["database"]["state"] == "ok"
    assert isinstance(body["checks"]["database"]["durationMs"], float)


@every_database
def test_readyz_is_503_naming_the_failing_check(client, settings):
    settings.CHANNEL_LAYERS = redis_layer(f"redis://127.0.0.1:{free_port()}/0")

    response = client.get("/readyz")

    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "not ready"
    assert body["checks"]["channelLayer"] == {
        "state": "failing",
        "reason": "unreachable",
        "durationMs": body["checks"]["channelLayer"]["durationMs"],
    }
    assert body["checks"]["database"]["state"] == "ok"


@every_database
def test_readyz_is_503_until_startup_recovery_has_run(client):
    state.startup_begun()
    try:
        during = client.get("/readyz")
    finally:
        state.startup_finished()
    after = client.get("/readyz")

    assert during.status_code == 503
    assert during.json()["checks"]["startup"] == {
        "state": "failing",
        "reason": "startup recovery still reconciling worker placements",
    }
    assert after.status_code == 200 and after.json()["checks"]["startup"] == {"state": "ok"}


# --- the task workers' warning --------------------------------------------------------------------


@pytest.fixture
def unconsumed_queue(settings, monkeypatch) -> Iterator[str]:
    """Celery task mode on a queue of this test's own that no worker consumes, asked of the real broker."""
    settings.OPENCLAW_TASK_MODE = "celery"
    settings.CELERY_TASK_DEFAULT_QUEUE = queue = f"test-readyz-{uuid.uuid4().hex[:12]}"
    watch = ConsumerWatch()
    monkeypatch.setattr(task_consumers, "consumer_watch", watch)
    yield queue
    cache.delete(UNCONSUMED_SINCE_KEY.format(queue))


@every_database
def test_in_process_tasks_need_no_worker(settings):
    settings.OPENCLAW_TASK_MODE = "inprocess"

    readiness = ReadinessChecks().run()

    assert readiness.checks["taskWorkers"].to_json() | {"durationMs": 0} == {
        "state": "not configured",
        "reason": "in-process",
        "durationMs": 0,
    }


@pytest.mark.redis
@every_database
def test_no_worker_on_the_turn_queue_is_a_warning_and_the_process_stays_ready(client, unconsumed_queue):
    first = client.get("/readyz")
    task_consumers.consumer_watch.fresh(PROBE_WAIT_S)
    response = client.get("/readyz")

    # The first answer did not wait for the broker: the check had not run yet.
    assert first.status_code == 200
    assert first.json()["checks"]["taskWorkers"]["reason"] == "not checked yet"
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ready"
    assert body["checks"]["taskWorkers"]["state"] == "warning"
    assert body["checks"]["taskWorkers"]["reason"] == worker_missing_message(unconsumed_queue)


@pytest.mark.redis
@every_database
def test_a_broker_that_does_not_answer_the_workers_check_is_a_warning_without_its_error_text(
    settings, unconsumed_queue
):
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{free_port()}/0"
    task_consumers.consumer_watch.refresh()

    readiness = ReadinessChecks().run(TEST_TIMEOUT_S)

    assert readiness.checks["taskWorkers"].state == CheckState.WARNING
    assert readiness.checks["taskWorkers"].reason == "not known: the broker did not answer"
    assert readiness.checks["broker"].state == CheckState.FAILING
