"""Whether anything consumes the deployment's Celery queue (docs/operations.md, "Task queue").

With ``REDIS_URL`` set, turns are tasks in the Celery queue ``OPENCLAW_CELERY_QUEUE``; a gateway started before
any worker would queue them in silence. So the gateway asks the broker who consumes that queue — RabbitMQ counts the
queue's consumers itself (``queue_declare(passive=True)``); Redis has no such count, so the workers are asked over
Celery's broadcast (``inspect().active_queues()``, the workers that answer within :data:`CHECK_TIMEOUT_S`) — and
says so: a WARNING when the queue is found unconsumed (at start-up and whenever it becomes so, after
:func:`warn_after_s`), the ``taskQueue`` field of ``health``, the ``taskWorkers`` check of ``/readyz``, the
console's banner, and, through ``sessions_app``'s watch, queued turns failed after ``OPENCLAW_TURN_PICKUP_TIMEOUT_S``.

The answer is cached per process and refreshed on a thread of its own (every :func:`check_interval_s`): asking
never waits on the broker, except :meth:`ConsumerWatch.fresh`, which waits a bounded time. Since when the queue has
been unconsumed is kept in the shared cache, so that every gateway process of the deployment counts from the same
moment. In-process tasks (the embedded default) have no queue: the state is ``in-process`` and nothing fails.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from celery import current_app
from django.conf import settings
from django.core.cache import cache
from kombu import Connection

from . import background
from .conf import gateway_setting
from .selectors import now_ms

logger = logging.getLogger(__name__)

# The broker's connect and read timeouts, and how long the workers' replies to the broadcast are waited for.
CHECK_TIMEOUT_S = 2.0
# The cached answer is refreshed this often at most (more often when the pickup timeout is short).
MAX_CHECK_INTERVAL_S = 15.0
MIN_CHECK_INTERVAL_S = 1.0
# The queue is reported unconsumed in the log once it has been so this long (or the pickup timeout, when shorter):
# the workers of `./dev cluster` start after its gateways, and their first seconds are no news.
WARN_AFTER_S = 10.0
UNCONSUMED_SINCE_KEY = "gateway:task-queue:unconsumed-since:{}"
UNCONSUMED_SINCE_TTL_S = 7 * 24 * 3600
# What starts a worker that consumes the queue: the README's production command, run with the gateway's
# environment (the same OPENCLAW_CELERY_QUEUE makes it the worker's default queue).
WORKER_COMMAND = ".venv/bin/celery -A openclaw_site worker -l info"


class QueueState(StrEnum):
    IN_PROCESS = "in-process"  # no queue: tasks run in the gateway process
    CONSUMED = "consumed"
    UNCONSUMED = "no-consumer"
    UNKNOWN = "unknown"  # not asked yet, or the broker did not answer


@dataclass(frozen=True)
class QueueConsumers:
    state: QueueState
    queue: str
    consumers: int | None = None
    checked_at_ms: int | None = None
    # When the deployment first found the queue unconsumed (this stretch), epoch ms.
    unconsumed_since_ms: int | None = None

    @property
    def worker_missing(self) -> bool:
        return self.state == QueueState.UNCONSUMED

    def message(self) -> str:
        return worker_missing_message(self.queue) if self.worker_missing else ""

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "mode": background.task_mode(),
            "state": str(self.state),
            "queue": self.queue,
            "consumers": self.consumers,
            "checkedAtMs": self.checked_at_ms,
        }
        if self.worker_missing:
            body["unconsumedSinceMs"] = self.unconsumed_since_ms
            body["message"] = self.message()
        return body


def worker_missing_message(queue: str) -> str:
    return (
        f"No Celery worker is consuming the turn queue '{queue}'; start one with `{WORKER_COMMAND}` "
        "in the gateway's environment (or run `./dev cluster`)"
    )


def turn_queue() -> str:
    return settings.CELERY_TASK_DEFAULT_QUEUE


def check_interval_s() -> float:
    """How old a cached answer may be: at most :data:`MAX_CHECK_INTERVAL_S`, and a quarter of the pickup timeout,
    so that a turn fails no later than a few checks after its timeout."""
    pickup_s = gateway_setting("TURN_PICKUP_TIMEOUT_S")
    if not pickup_s:
        return MAX_CHECK_INTERVAL_S
    return min(MAX_CHECK_INTERVAL_S, max(MIN_CHECK_INTERVAL_S, pickup_s / 4))


def warn_after_s() -> float:
    pickup_s = gateway_setting("TURN_PICKUP_TIMEOUT_S")
    return min(WARN_AFTER_S, pickup_s) if pickup_s else WARN_AFTER_S


def broker_connection() -> Connection:
    """A connection to the Celery broker with short timeouts and the deployment's key prefix (Redis)."""
    options = {
        **getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}),
        "max_retries": 1,
        "socket_timeout": CHECK_TIMEOUT_S,
        "socket_connect_timeout": CHECK_TIMEOUT_S,
    }
    return Connection(settings.CELERY_BROKER_URL, connect_timeout=CHECK_TIMEOUT_S, transport_options=options)


def count_consumers(queue: str) -> int:
    """The consumers of ``queue`` now: RabbitMQ's own count; on Redis, the workers that answer the broadcast
    within :data:`CHECK_TIMEOUT_S` and list ``queue`` among the queues they consume."""
    with broker_connection() as broker:
        broker.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=CHECK_TIMEOUT_S)
        if broker.transport.driver_type == "amqp":
            try:
                return broker.default_channel.queue_declare(queue=queue, passive=True).consumer_count
            except broker.channel_errors:
                return 0  # never declared: no worker consumed it yet (a worker declares its queues at start)
        replies = current_app.control.inspect(timeout=CHECK_TIMEOUT_S, connection=broker).active_queues() or {}
    return sum(1 for queues in replies.values() if any(entry.get("name") == queue for entry in queues or ()))


def _unconsumed_since(consumers: int) -> int | None:
    """Since when the deployment has found the queue unconsumed (kept in the shared cache); None once consumed."""
    key = UNCONSUMED_SINCE_KEY.format(turn_queue())
    if consumers:
        cache.delete(key)
        return None
    cache.add(key, now_ms(), timeout=UNCONSUMED_SINCE_TTL_S)
    return cache.get(key)


def probe() -> QueueConsumers:
    queue = turn_queue()
    if background.task_mode() != "celery":
        return QueueConsumers(QueueState.IN_PROCESS, queue, checked_at_ms=now_ms())
    consumers = count_consumers(queue)
    return QueueConsumers(
        QueueState.CONSUMED if consumers else QueueState.UNCONSUMED,
        queue,
        consumers=consumers,
        checked_at_ms=now_ms(),
        unconsumed_since_ms=_unconsumed_since(consumers),
    )


class ConsumerWatch:
    """This process's latest answer and the refresh in flight (one at a time, on a thread of its own).

    Public so that a test can start from a watch of its own."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latest: QueueConsumers | None = None
        self.refreshed_at: float | None = None
        self.in_flight: Future[QueueConsumers] | None = None
        self.logged_state: QueueState | None = None

    def current(self) -> QueueConsumers:
        """The latest answer without waiting (``unknown`` before the first); a stale one starts a refresh."""
        if background.task_mode() != "celery":
            return QueueConsumers(QueueState.IN_PROCESS, turn_queue())
        self._refresh_if_stale()
        return self.latest or QueueConsumers(QueueState.UNKNOWN, turn_queue())

    def fresh(self, timeout_s: float) -> QueueConsumers:
        """A current answer, waiting at most ``timeout_s`` for the refresh a stale one starts."""
        refresh = self._refresh_if_stale()
        if refresh is not None:
            try:
                refresh.result(timeout_s)
            except FutureTimeout:
                pass
        return self.current()

    def recent(self, max_age_s: float) -> QueueConsumers | None:
        """The latest answer if the broker was asked at most ``max_age_s`` ago; else ``None``, and a refresh starts
        (without waiting): a caller about to act on the answer asks again on its next round."""
        answer = self.current()
        if answer.checked_at_ms is not None and now_ms() - answer.checked_at_ms <= max_age_s * 1000:
            return answer
        self._refresh_if_stale(max_age_s)
        return None

    def _refresh_if_stale(self, max_age_s: float | None = None) -> Future[QueueConsumers] | None:
        interval_s = check_interval_s() if max_age_s is None else min(max_age_s, check_interval_s())
        with self.lock:
            if self.refreshed_at is not None and time.monotonic() - self.refreshed_at < interval_s:
                return None
            if self.in_flight is None or self.in_flight.done():
                self.in_flight = self._refresh_in_the_background()
            return self.in_flight

    def _refresh_in_the_background(self) -> Future[QueueConsumers]:
        """:meth:`refresh` on a daemon thread of its own. Not a ``ThreadPoolExecutor``: the interpreter joins those
        at exit, and a broadcast to the workers waits out its whole timeout for replies (``CHECK_TIMEOUT_S``), so
        every stop of the gateway took that long; an answer nobody will read must not hold the process."""
        future: Future[QueueConsumers] = Future()

        def run() -> None:
            try:
                future.set_result(self.refresh())
            except BaseException as failure:  # handed to whoever waits on the future
                future.set_exception(failure)

        threading.Thread(target=run, name="task-consumers", daemon=True).start()
        return future

    def refresh(self) -> QueueConsumers:
        try:
            answer = probe()
        except Exception as failure:
            answer = QueueConsumers(QueueState.UNKNOWN, turn_queue(), checked_at_ms=now_ms())
            self._note(answer, failure)
        else:
            self._note(answer)
        with self.lock:
            self.latest, self.refreshed_at = answer, time.monotonic()
        return answer

    def _note(self, answer: QueueConsumers, failure: BaseException | None = None) -> None:
        """One log line per change of state: the missing worker as a WARNING an operator acts on, once the queue has
        been unconsumed for :func:`warn_after_s` (a later check looks again)."""
        if answer.worker_missing and not _unconsumed_for(answer, warn_after_s()):
            return
        previous, self.logged_state = self.logged_state, answer.state
        if answer.state == previous:
            return
        if answer.worker_missing:
            logger.warning("%s", answer.message())
        elif answer.state == QueueState.CONSUMED and previous in (QueueState.UNCONSUMED, QueueState.UNKNOWN):
            logger.info("%d Celery worker(s) consume the turn queue '%s'", answer.consumers, answer.queue)
        elif answer.state == QueueState.UNKNOWN:
            logger.warning("could not ask the broker who consumes the turn queue '%s': %s", answer.queue, failure)


def _unconsumed_for(answer: QueueConsumers, seconds: float) -> bool:
    if answer.unconsumed_since_ms is None or answer.checked_at_ms is None:
        return True
    return answer.checked_at_ms - answer.unconsumed_since_ms >= seconds * 1000


consumer_watch = ConsumerWatch()


def start_watching() -> None:
    """The first check, at start-up (a startup hook), on the watch's thread: the start does not wait for the broker.
    The WARNING follows from this check or a later one, once the queue has been unconsumed for
    :func:`warn_after_s`."""
    consumer_watch.current()
