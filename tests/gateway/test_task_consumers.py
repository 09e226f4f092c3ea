"""Who consumes the turn queue (gateway/task_consumers.py), asked of real brokers: Redis (the README's production
variables) and RabbitMQ (``CELERY_BROKER_URL=amqp://…``), without a worker and with a real Celery worker process.

Each test has a queue of its own, so that the workers other tests start (they consume queues of their own) are not
counted."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator

import pytest
from django.core.cache import cache

from gateway import task_consumers
from gateway.dispatch import run_request
from gateway.protocol import RequestFrame
from gateway.selectors import now_ms
from gateway.task_consumers import UNCONSUMED_SINCE_KEY, ConsumerWatch, QueueState, worker_missing_message
from tests.e2e.test_cluster import RABBITMQ_URL, _reachable, _require
from tests.support.connections import admin_operator_context
from tests.support.processes import (
    GatewayLaunch,
    free_port,
    gateway_settings_for_tests,
    start_celery_worker,
    stop_process_checked,
)

PROBE_WAIT_S = 15.0


@pytest.fixture
def own_queue(settings) -> Iterator[str]:
    settings.OPENCLAW_TASK_MODE = "celery"
    settings.CELERY_TASK_DEFAULT_QUEUE = queue = f"test-consumers-{uuid.uuid4().hex[:12]}"
    yield queue
    cache.delete(UNCONSUMED_SINCE_KEY.format(queue))


@pytest.fixture
def rabbitmq(settings) -> str:
    _require(_reachable("127.0.0.1", 5672), "RabbitMQ (127.0.0.1:5672)")
    settings.CELERY_BROKER_URL = RABBITMQ_URL
    return RABBITMQ_URL


@pytest.fixture
def worker_of(settings):
    """``worker_of(queue)``: a real Celery worker process consuming ``queue`` with this test process's broker and key
    prefix; stopped (and checked to stop cleanly) when the test ends."""
    started: list[tuple[object, GatewayLaunch]] = []

    def start(queue: str):
        port = free_port()
        launch = GatewayLaunch.prepare(
            settings={
                **gateway_settings_for_tests(port),
                "OPENCLAW_CELERY_QUEUE": queue,
                "OPENCLAW_REDIS_PREFIX": settings.REDIS_PREFIX,
                "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            },
            port=port,
        )
        worker, _log = start_celery_worker(launch.env, launch.state_dir, concurrency=1)
        started.append((worker, launch))
        return worker

    yield start
    for worker, launch in started:
        try:
            stop_process_checked(worker, "celery worker")
        finally:
            launch.remove_state()


def test_in_process_tasks_have_no_queue_to_watch(settings):
    settings.OPENCLAW_TASK_MODE = "inprocess"

    answer = ConsumerWatch().current()

    assert answer.state == QueueState.IN_PROCESS and not answer.worker_missing
    assert answer.to_json() == {
        "mode": "inprocess",
        "state": "in-process",
        "queue": settings.CELERY_TASK_DEFAULT_QUEUE,
        "consumers": None,
        "checkedAtMs": None,
    }


def unconsumed_since(queue: str, seconds_ago: float) -> None:
    """As a gateway that has found ``queue`` unconsumed for ``seconds_ago`` would have left the shared cache."""
    cache.set(UNCONSUMED_SINCE_KEY.format(queue), now_ms() - int(seconds_ago * 1000), timeout=600)


@pytest.mark.redis
def test_a_redis_queue_without_a_worker_has_no_consumer_since_the_first_check(own_queue, caplog):
    watch = ConsumerWatch()
    with caplog.at_level(logging.INFO, logger="gateway.task_consumers"):
        first = watch.fresh(PROBE_WAIT_S)
        second = watch.refresh()

    assert (first.state, first.consumers) == (QueueState.UNCONSUMED, 0)
    assert first.unconsumed_since_ms is not None
    # Counted from the first check, whichever process makes the next one.
    assert second.unconsumed_since_ms == first.unconsumed_since_ms
    message = worker_missing_message(own_queue)
    assert first.message() == message and first.to_json()["message"] == message
    assert f"'{own_queue}'" in message and task_consumers.WORKER_COMMAND in message
    # A worker starting with the gateway (./dev cluster) gets a few seconds before the log says it is missing.
    assert caplog.records == []


@pytest.mark.redis
def test_a_queue_unconsumed_past_the_grace_is_one_warning_not_one_per_check(own_queue, caplog):
    unconsumed_since(own_queue, task_consumers.WARN_AFTER_S + 1)
    watch = ConsumerWatch()
    with caplog.at_level(logging.INFO, logger="gateway.task_consumers"):
        watch.refresh()
        watch.refresh()

    assert [(record.levelno, record.getMessage()) for record in caplog.records] == [
        (logging.WARNING, worker_missing_message(own_queue))
    ]


@pytest.mark.redis
def test_a_rabbitmq_queue_without_a_worker_has_no_consumer(own_queue, rabbitmq):
    answer = ConsumerWatch().fresh(PROBE_WAIT_S)

    assert (answer.state, answer.consumers) == (QueueState.UNCONSUMED, 0)


@pytest.mark.redis
@pytest.mark.slow
def test_a_real_worker_on_redis_is_seen_and_its_stop_too(own_queue, worker_of, caplog):
    worker = worker_of(own_queue)
    watch = ConsumerWatch()
    with caplog.at_level(logging.INFO, logger="gateway.task_consumers"):
        consumed = watch.refresh()
        stop_process_checked(worker, "celery worker")
        gone = watch.refresh()
        unconsumed_since(own_queue, task_consumers.WARN_AFTER_S + 1)
        still_gone = watch.refresh()

    assert (consumed.state, consumed.consumers, consumed.unconsumed_since_ms) == (QueueState.CONSUMED, 1, None)
    assert (gone.state, gone.consumers) == (QueueState.UNCONSUMED, 0)
    assert gone.unconsumed_since_ms >= consumed.checked_at_ms
    assert still_gone.state == QueueState.UNCONSUMED
    assert [(record.levelno, record.getMessage()) for record in caplog.records] == [
        (logging.WARNING, worker_missing_message(own_queue))
    ]


@pytest.mark.redis
@pytest.mark.slow
def test_a_real_worker_on_rabbitmq_is_counted_by_the_broker(own_queue, rabbitmq, worker_of):
    worker_of(own_queue)

    answer = ConsumerWatch().refresh()

    assert (answer.state, answer.consumers) == (QueueState.CONSUMED, 1)


@pytest.mark.redis
@pytest.mark.slow
def test_a_redis_worker_of_another_queue_does_not_count(own_queue, worker_of):
    """On Redis every worker answers the broadcast: only those that consume this queue count."""
    worker_of(f"{own_queue}-other")

    answer = ConsumerWatch().refresh()

    assert (answer.state, answer.queue, answer.consumers) == (QueueState.UNCONSUMED, own_queue, 0)


@pytest.mark.redis
def test_a_broker_that_does_not_answer_is_unknown_never_missing(own_queue, settings, caplog):
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{free_port()}/0"
    watch = ConsumerWatch()

    with caplog.at_level(logging.WARNING, logger="gateway.task_consumers"):
        answer = watch.refresh()

    assert answer.state == QueueState.UNKNOWN and not answer.worker_missing
    assert answer.message() == "" and "message" not in answer.to_json()
    assert watch.current() == answer
    assert f"could not ask the broker who consumes the turn queue '{own_queue}'" in caplog.text


@pytest.mark.redis
def test_asking_never_waits_for_the_broker(own_queue, settings):
    """``current()`` answers ``unknown`` at once before the first check; the check runs on the watch's thread."""
    watch = ConsumerWatch()

    before = watch.current()
    in_flight = watch.in_flight

    assert before.state == QueueState.UNKNOWN and before.checked_at_ms is None
    assert in_flight is not None
    assert in_flight.result(PROBE_WAIT_S).state == QueueState.UNCONSUMED
    assert watch.current().state == QueueState.UNCONSUMED


# --- health ---------------------------------------------------------------------------------------


def health_payload() -> dict:
    response = asyncio.run(run_request(admin_operator_context(), RequestFrame(type="req", id="h", method="health")))
    assert response["ok"] is True, response
    return response["payload"]


@pytest.mark.django_db(transaction=True)
def test_health_says_tasks_run_in_process_and_keeps_openclaws_fields(settings):
    settings.OPENCLAW_TASK_MODE = "inprocess"

    payload = health_payload()

    assert payload["ok"] is True and isinstance(payload["ts"], int) and isinstance(payload["durationMs"], float)
    assert payload["taskQueue"] | {"queue": None} == {
        "mode": "inprocess",
        "state": "in-process",
        "queue": None,
        "consumers": None,
        "checkedAtMs": None,
    }


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_health_names_the_missing_worker_and_the_process_stays_ok(own_queue, monkeypatch):
    watch = ConsumerWatch()
    monkeypatch.setattr(task_consumers, "consumer_watch", watch)
    watch.fresh(PROBE_WAIT_S)

    payload = health_payload()

    assert payload["ok"] is True
    task_queue = payload["taskQueue"]
    assert (task_queue["mode"], task_queue["state"], task_queue["queue"]) == ("celery", "no-consumer", own_queue)
    assert task_queue["consumers"] == 0 and isinstance(task_queue["unconsumedSinceMs"], int)
    assert task_queue["message"] == worker_missing_message(own_queue)
