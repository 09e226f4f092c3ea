"""A queued turn that no Celery worker takes fails after ``OPENCLAW_TURN_PICKUP_TIMEOUT_S`` with the reason that
names the missing worker (``runs_fail_unclaimed``), and a worker claiming the turn at the same moment either wins or
loses, never both (``run_fail_queued`` and ``run_claim``: the same compare-and-set under the session lock).

Whether a worker consumes the queue is asked of the real broker (Redis, a queue of this test's own that no worker
consumes); the moment the deployment first found it unconsumed is set in the shared cache, as a gateway that has been
watching for a minute would have left it."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import connections
from django.utils import timezone

from gateway import task_consumers
from gateway.selectors import now_ms
from gateway.task_consumers import (
    UNCONSUMED_SINCE_KEY,
    ConsumerWatch,
    QueueConsumers,
    QueueState,
    worker_missing_message,
)
from sessions_app.models import Run, Session, TranscriptEvent
from sessions_app.services import runs, sessions

PICKUP_TIMEOUT_S = 5
PROBE_WAIT_S = 15.0


@pytest.fixture(autouse=True)
def _no_dispatch(monkeypatch):
    """Nothing runs the submitted turns: the tests claim and fail them themselves."""
    dispatched: list[str] = []
    monkeypatch.setattr(runs, "dispatch_turn_on_commit", lambda run_id, session: dispatched.append(run_id))
    return dispatched


@pytest.fixture
def pickup_timeout(settings):
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "TURN_PICKUP_TIMEOUT_S": PICKUP_TIMEOUT_S}


@pytest.fixture
def unconsumed_queue(settings, monkeypatch, pickup_timeout):
    """Celery task mode on a queue of this test's own, which no worker consumes; a watch of this test's own that
    has asked the broker, with the queue unconsumed for ``seconds_ago`` (default a minute)."""
    settings.OPENCLAW_TASK_MODE = "celery"
    settings.CELERY_TASK_DEFAULT_QUEUE = f"test-pickup-{uuid.uuid4().hex[:12]}"

    def watched(seconds_ago: float = 60.0) -> ConsumerWatch:
        key = UNCONSUMED_SINCE_KEY.format(settings.CELERY_TASK_DEFAULT_QUEUE)
        cache.set(key, now_ms() - int(seconds_ago * 1000), timeout=600)
        watch = ConsumerWatch()
        monkeypatch.setattr(task_consumers, "consumer_watch", watch)
        answer = watch.fresh(PROBE_WAIT_S)
        assert answer.state == QueueState.UNCONSUMED, answer
        return watch

    yield watched
    cache.delete(UNCONSUMED_SINCE_KEY.format(settings.CELERY_TASK_DEFAULT_QUEUE))


def make(key: str) -> Session:
    return sessions.session_create(spec=sessions.SessionSpec(key=key, agent_id="main"))


def submit(key: str, run_id: str, *, age_s: float = 0.0) -> Run:
    runs.run_submit(session_key=key, message=f"message of {run_id}", idempotency_key=run_id)
    if age_s:
        Run.objects.filter(run_id=run_id).update(created_at=timezone.now() - timedelta(seconds=age_s))
    return Run.objects.get(run_id=run_id)


@pytest.mark.redis
@pytest.mark.django_db
def test_a_turn_queued_past_the_timeout_fails_naming_the_missing_worker(settings, unconsumed_queue, _no_dispatch):
    unconsumed_queue()
    make("agent:main:old")
    make("agent:main:new")
    submit("agent:main:old", "old-1", age_s=PICKUP_TIMEOUT_S + 5)
    submit("agent:main:old", "old-2", age_s=PICKUP_TIMEOUT_S + 4)
    submit("agent:main:new", "new-1")

    assert runs.runs_fail_unclaimed() == ["old-1", "old-2"]

    reason = worker_missing_message(settings.CELERY_TASK_DEFAULT_QUEUE)
    assert f"'{settings.CELERY_TASK_DEFAULT_QUEUE}'" in reason and task_consumers.WORKER_COMMAND in reason
    for run_id in ("old-1", "old-2"):
        run = Run.objects.get(run_id=run_id)
        assert (run.status, run.error, run.error_kind, run.started_at) == ("error", reason, runs.WORKER_MISSING, None)
        assert run.ended_at is not None
    assert Run.objects.get(run_id="new-1").status == "queued"
    old = Session.objects.get(key="agent:main:old")
    assert old.status == "failed"
    # Only a started turn writes its user message; neither started.
    assert not TranscriptEvent.objects.filter(window_id=old.session_id).exists()
    # Failing the first dispatched the session's next queued turn, as any end of a turn does.
    assert _no_dispatch[-1] == "old-2"
    # Nothing is left to fail: a second pass changes nothing.
    assert runs.runs_fail_unclaimed() == []


def overdue_turn_on_a_minute_old_answer(unconsumed_queue) -> tuple[ConsumerWatch, QueueConsumers]:
    """A turn past the pickup timeout, and a watch whose answer (returned as it was) is made a minute old."""
    watch = unconsumed_queue()
    make("agent:main:s")
    submit("agent:main:s", "r1", age_s=PICKUP_TIMEOUT_S + 5)
    asked = watch.latest
    watch.latest = dataclasses.replace(asked, checked_at_ms=asked.checked_at_ms - 60_000)
    watch.refreshed_at -= 60
    return watch, asked


@pytest.mark.redis
@pytest.mark.django_db
def test_an_answer_older_than_a_few_seconds_is_asked_again_before_a_turn_fails(unconsumed_queue):
    """A worker may have come back since the cached answer: the first round asks the broker again and fails
    nothing; the next one acts on the new answer."""
    watch, asked = overdue_turn_on_a_minute_old_answer(unconsumed_queue)

    assert runs.runs_fail_unclaimed() == []
    assert Run.objects.get(run_id="r1").status == "queued"
    watch.in_flight.result(PROBE_WAIT_S)
    assert watch.latest.checked_at_ms >= asked.checked_at_ms
    assert runs.runs_fail_unclaimed() == ["r1"]


@pytest.mark.redis
@pytest.mark.django_db
def test_a_worker_found_on_the_second_look_keeps_the_turn(unconsumed_queue, monkeypatch):
    watch, asked = overdue_turn_on_a_minute_old_answer(unconsumed_queue)
    came_back = dataclasses.replace(asked, state=QueueState.CONSUMED, consumers=1, unconsumed_since_ms=None)
    monkeypatch.setattr(task_consumers, "probe", lambda: dataclasses.replace(came_back, checked_at_ms=now_ms()))

    assert runs.runs_fail_unclaimed() == []
    watch.in_flight.result(PROBE_WAIT_S)
    assert runs.runs_fail_unclaimed() == []
    assert Run.objects.get(run_id="r1").status == "queued"


@pytest.mark.redis
@pytest.mark.django_db
def test_a_queue_unconsumed_for_less_than_the_timeout_fails_nothing(unconsumed_queue):
    """A worker restarted within the timeout loses no turn, however long the turn itself has waited."""
    unconsumed_queue(seconds_ago=1)
    make("agent:main:s")
    submit("agent:main:s", "r1", age_s=PICKUP_TIMEOUT_S * 10)

    assert runs.runs_fail_unclaimed() == []
    assert Run.objects.get(run_id="r1").status == "queued"


@pytest.mark.redis
@pytest.mark.django_db
def test_a_turn_running_in_a_celery_worker_proves_a_worker_is_there(unconsumed_queue):
    """A ``solo`` pool answers no broadcast while it runs a task: the running turn is the proof."""
    unconsumed_queue()
    make("agent:main:busy")
    make("agent:main:waiting")
    submit("agent:main:busy", "running")
    runs.run_claim(run_id="running", executor="celery:host:1")
    submit("agent:main:waiting", "queued", age_s=PICKUP_TIMEOUT_S + 5)

    assert runs.runs_fail_unclaimed() == []
    assert Run.objects.get(run_id="queued").status == "queued"


@pytest.mark.redis
@pytest.mark.django_db
def test_a_turn_queued_behind_a_running_turn_of_its_session_waits_for_it(unconsumed_queue):
    unconsumed_queue()
    make("agent:main:s")
    submit("agent:main:s", "first")
    runs.run_claim(run_id="first", executor="test")
    submit("agent:main:s", "second", age_s=PICKUP_TIMEOUT_S + 5)

    assert runs.runs_fail_unclaimed() == []
    assert runs.run_fail_queued(run_id="second", reason="x", kind=runs.WORKER_MISSING) is None
    assert Run.objects.get(run_id="second").status == "queued"


@pytest.mark.django_db
def test_in_process_tasks_never_fail_a_queued_turn(settings, pickup_timeout):
    settings.OPENCLAW_TASK_MODE = "inprocess"
    make("agent:main:s")
    submit("agent:main:s", "r1", age_s=3600)

    assert task_consumers.consumer_watch.current().state == QueueState.IN_PROCESS
    assert runs.runs_fail_unclaimed() == []
    assert Run.objects.get(run_id="r1").status == "queued"


@pytest.mark.redis
@pytest.mark.django_db
def test_a_pickup_timeout_of_zero_leaves_turns_queued(settings, unconsumed_queue):
    unconsumed_queue()
    settings.OPENCLAW_GATEWAY = {**settings.OPENCLAW_GATEWAY, "TURN_PICKUP_TIMEOUT_S": 0}
    make("agent:main:s")
    submit("agent:main:s", "r1", age_s=3600)

    assert runs.runs_fail_unclaimed() == []
    assert Run.objects.get(run_id="r1").status == "queued"


@pytest.mark.django_db
def test_the_failure_and_the_claim_each_leave_the_other_nothing():
    make("agent:main:a")
    make("agent:main:b")
    submit("agent:main:a", "claimed-first")
    submit("agent:main:b", "failed-first")

    assert runs.run_claim(run_id="claimed-first", executor="celery:host:1") is not None
    assert runs.run_fail_queued(run_id="claimed-first", reason="late", kind=runs.WORKER_MISSING) is None
    assert Run.objects.get(run_id="claimed-first").status == "running"

    assert runs.run_fail_queued(run_id="failed-first", reason="gone", kind=runs.WORKER_MISSING) is not None
    assert runs.run_claim(run_id="failed-first", executor="celery:host:1") is None
    failed = Run.objects.get(run_id="failed-first")
    assert (failed.status, failed.error, failed.executor) == ("error", "gone", "")
    assert runs.run_fail_queued(run_id="unknown", reason="x", kind=runs.WORKER_MISSING) is None


RACES = 6


def race(run_id: str) -> dict[str, object]:
    """``run_claim`` and ``run_fail_queued`` of ``run_id`` released together (a barrier), each in a thread and a
    transaction of its own; what each returned (or raised)."""
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}
    actions = {
        "claim": lambda: runs.run_claim(run_id=run_id, executor="celery:host:7"),
        "fail": lambda: runs.run_fail_queued(run_id=run_id, reason="no worker", kind=runs.WORKER_MISSING),
    }

    def contender(name: str) -> None:
        try:
            barrier.wait()
            results[name] = actions[name]()
        except Exception as failure:  # reported by the caller: a failure of either side fails the test
            results[name] = failure
        finally:
            connections.close_all()

    threads = [threading.Thread(target=contender, args=(name,)) for name in actions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


@pytest.mark.django_db(transaction=True)
def test_a_worker_claiming_while_the_gateway_fails_the_turn_wins_or_loses_never_both():
    """Exactly one of the claim and the failure changes the run, and the rows agree with the winner."""
    for attempt in range(RACES):
        key, run_id = f"agent:main:race-{attempt}", f"race-{attempt}"
        make(key)
        submit(key, run_id)

        results = race(run_id)

        assert set(results) == {"claim", "fail"}
        assert not any(isinstance(result, Exception) for result in results.values()), results
        claimed, failed = results["claim"] is not None, results["fail"] is not None
        assert claimed != failed, results
        run = Run.objects.get(run_id=run_id)
        user_messages = TranscriptEvent.objects.filter(window_id=run.window_id).count()
        if claimed:
            assert (run.status, run.executor, run.error_kind, user_messages) == ("running", "celery:host:7", "", 1)
        else:
            assert (run.status, run.executor, run.error_kind, user_messages) == ("error", "", runs.WORKER_MISSING, 0)
