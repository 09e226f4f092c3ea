"""Liveness and readiness of this process, for load balancers and orchestrators (docs/operations.md, "Health").

Readiness is six checks: startup recovery has run (operators' reads wait for it until then), the database
answers, the channel layer's Redis answers (the in-memory layer always does), the Celery broker answers when turns
run in Celery, no migration is left unapplied, and a Celery worker consumes the turn queue. The last one is only
ever a ``warning``, never "not ready": without a worker the process still serves everything but turns, and every
process of the deployment would leave the load balancer at once. Each check runs
on a thread of its own with a deadline, so a database that stopped answering makes ``/readyz`` say so within
:data:`CHECK_TIMEOUT_S` instead of hanging with it; a check still running from an earlier call is waited for
again rather than started twice, so a dead dependency never piles up threads.

What a check reports is a fixed word (``ok``, ``warning``, ``failing``, ``timeout``, ``not configured``) and a fixed
reason:
``/readyz`` answers anyone, so exception text only goes to the log, once per change of state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import redis
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor
from kombu import Connection as BrokerConnection

from gateway import state, task_consumers
from gateway.health import probe_database
from gateway.task_consumers import QueueState

logger = logging.getLogger(__name__)

# Longer than a healthy probe on a loaded machine, short enough for HAProxy (checks every second, `fall 2`)
# and orchestrators (probe timeouts of a few seconds) to see a dead dependency in time.
CHECK_TIMEOUT_S = 2.0
REDIS_CHANNEL_LAYER = "channels_redis.core.RedisChannelLayer"


class CheckState(StrEnum):
    OK = "ok"
    # Ready, with something an operator should act on (the reason says what).
    WARNING = "warning"
    FAILING = "failing"
    TIMEOUT = "timeout"
    NOT_CONFIGURED = "not configured"


READY_STATES = frozenset({CheckState.OK, CheckState.WARNING, CheckState.NOT_CONFIGURED})


@dataclass(frozen=True)
class CheckResult:
    state: CheckState
    # A fixed text a client may see (never an exception's message).
    reason: str = ""
    duration_ms: float | None = None

    @property
    def ready(self) -> bool:
        return self.state in READY_STATES

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"state": str(self.state)}
        if self.reason:
            body["reason"] = self.reason
        if self.duration_ms is not None:
            body["durationMs"] = round(self.duration_ms, 3)
        return body


@dataclass(frozen=True)
class Readiness:
    checks: dict[str, CheckResult] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return all(result.ready for result in self.checks.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "status": "ready" if self.ready else "not ready",
            "checks": {name: result.to_json() for name, result in self.checks.items()},
        }


class ProbeFailed(Exception):
    """A dependency answered, but not as readiness needs (``reason`` is shown to clients)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class BoundedCheck:
    """One readiness probe: run on this check's own thread, at most one run in flight, logged on change."""

    def __init__(self, name: str, probe: Callable[[], CheckResult], *, failure_reason: str):
        self.name = name
        self.probe = probe
        self.failure_reason = failure_reason
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"readyz-{name}")
        self.lock = threading.Lock()
        self.in_flight: Future[CheckResult] | None = None
        self.last_state: CheckState | None = None

    def start(self) -> Future[CheckResult]:
        with self.lock:
            if self.in_flight is None or self.in_flight.done():
                self.in_flight = self.executor.submit(self.run)
            return self.in_flight

    def run(self) -> CheckResult:
        """The probe, timed; any exception is the dependency failing (logged with its traceback when the state
        changes, so a dead database logs once, not once a second)."""
        started = time.perf_counter()
        failure: BaseException | None = None
        try:
            result = self.probe()
        except ProbeFailed as refused:
            result = CheckResult(CheckState.FAILING, refused.reason)
        except Exception as exc:
            failure = exc
            result = CheckResult(CheckState.FAILING, self.failure_reason)
        result = CheckResult(result.state, result.reason, (time.perf_counter() - started) * 1000)
        self.note(result, failure)
        return result

    def note(self, result: CheckResult, failure: BaseException | None = None) -> None:
        if result.state == self.last_state:
            return
        if result.state == CheckState.WARNING:
            pass  # the probe's own module logs what the warning is about
        elif result.ready:
            if self.last_state is not None:
                logger.warning("readiness check %s is %s again", self.name, result.state)
        else:
            logger.warning("readiness check %s is %s: %s", self.name, result.state, result.reason, exc_info=failure)
        self.last_state = result.state


def _close_connections(*aliases: str) -> None:
    """Give the probe thread's connections back (to psycopg's pool on PostgreSQL) after each probe: this thread
    lives as long as the process and must not keep one for itself."""
    for alias in aliases:
        connections[alias].close()


def database_probe() -> CheckResult:
    try:
        probe_database()
    finally:
        _close_connections(DEFAULT_DB_ALIAS)
    return CheckResult(CheckState.OK)


def channel_layer_addresses() -> list[str]:
    """The Redis servers of the channel layer; none for the in-memory layer (nothing outside to reach)."""
    layer = settings.CHANNEL_LAYERS.get("default", {})
    if layer.get("BACKEND") != REDIS_CHANNEL_LAYER:
        return []
    addresses = []
    for host in layer.get("CONFIG", {}).get("hosts", []):
        if isinstance(host, dict):
            addresses.append(host["address"])
        elif isinstance(host, str):
            addresses.append(host)
        else:
            address, port = host
            addresses.append(f"redis://{address}:{port}")
    return addresses


def _redis_ping(address: str) -> None:
    client = redis.Redis.from_url(address, socket_connect_timeout=CHECK_TIMEOUT_S, socket_timeout=CHECK_TIMEOUT_S)
    try:
        client.ping()
    finally:
        client.close()


def channel_layer_probe() -> CheckResult:
    addresses = channel_layer_addresses()
    if not addresses:
        return CheckResult(CheckState.OK, "in-memory")
    for address in addresses:
        _redis_ping(address)
    return CheckResult(CheckState.OK, "redis")


def broker_configured() -> bool:
    """Turns run in Celery workers only in the ``celery`` task mode; otherwise no broker is used at all."""
    return settings.OPENCLAW_TASK_MODE == "celery"


def broker_probe() -> CheckResult:
    if not broker_configured():
        return CheckResult(CheckState.NOT_CONFIGURED)
    options = {"socket_connect_timeout": CHECK_TIMEOUT_S, "socket_timeout": CHECK_TIMEOUT_S, "max_retries": 0}
    with BrokerConnection(
        settings.CELERY_BROKER_URL, connect_timeout=CHECK_TIMEOUT_S, transport_options=options
    ) as broker:
        broker.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=CHECK_TIMEOUT_S)
    return CheckResult(CheckState.OK)


def task_workers_probe() -> CheckResult:
    """Whether a Celery worker consumes the turn queue, from the latest check of ``gateway.task_consumers`` (never
    waited for: a stale one is refreshed on its own thread, the broadcast to Redis workers takes seconds)."""
    if not broker_configured():
        return CheckResult(CheckState.NOT_CONFIGURED, "in-process")
    consumers = task_consumers.consumer_watch.current()
    if consumers.state == QueueState.CONSUMED:
        return CheckResult(CheckState.OK, f"{consumers.consumers} consumer(s) of queue '{consumers.queue}'")
    if consumers.worker_missing:
        return CheckResult(CheckState.WARNING, consumers.message())
    if consumers.checked_at_ms is None:
        return CheckResult(CheckState.WARNING, "not checked yet")
    return CheckResult(CheckState.WARNING, "not known: the broker did not answer")


class MigrationsCheck:
    """Unapplied migrations of every database, computed once per process and again only while some were left
    (loading every migration module costs far more than a readiness probe should)."""

    def __init__(self) -> None:
        self.applied = False

    def __call__(self) -> CheckResult:
        if self.applied:
            return CheckResult(CheckState.OK)
        aliases = list(settings.DATABASES)
        try:
            pending = sum(self.pending_count(alias) for alias in aliases)
        finally:
            _close_connections(*aliases)
        if pending:
            raise ProbeFailed(f"{pending} unapplied migrations")
        self.applied = True
        return CheckResult(CheckState.OK)

    @staticmethod
    def pending_count(alias: str) -> int:
        executor = MigrationExecutor(connections[alias])
        return len(executor.migration_plan(executor.loader.graph.leaf_nodes()))


class ReadinessChecks:
    """The checks of this process (one instance per process: their threads and caches live here)."""

    def __init__(self) -> None:
        self.migrations = MigrationsCheck()
        self.checks = {
            "database": BoundedCheck("database", database_probe, failure_reason="unreachable"),
            "channelLayer": BoundedCheck("channelLayer", channel_layer_probe, failure_reason="unreachable"),
            "broker": BoundedCheck("broker", broker_probe, failure_reason="unreachable"),
            "migrations": BoundedCheck("migrations", self.migrations, failure_reason="not checked: database error"),
            "taskWorkers": BoundedCheck("taskWorkers", task_workers_probe, failure_reason="not checked"),
        }

    def run(self, timeout_s: float = CHECK_TIMEOUT_S) -> Readiness:
        """Every check at once; one that has not answered within ``timeout_s`` is ``timeout``."""
        futures = {name: check.start() for name, check in self.checks.items()}
        wait_for_futures(futures.values(), timeout=timeout_s)
        # Reconcile before serving: until startup recovery has run, operators' reads wait, so the process is not ready.
        results = {"startup": startup_result()}
        for name, future in futures.items():
            if future.done():
                results[name] = future.result()
            else:
                results[name] = CheckResult(CheckState.TIMEOUT, f"no answer within {timeout_s:g} s")
                self.checks[name].note(results[name])
        return Readiness(results)


readiness_checks = ReadinessChecks()


def startup_result() -> CheckResult:
    if state.serving():
        return CheckResult(CheckState.OK)
    return CheckResult(CheckState.FAILING, "startup recovery still reconciling worker placements")


def readiness() -> Readiness:
    return readiness_checks.run()


def liveness() -> dict[str, Any]:
    """The process answers; nothing else is asked (a dead database must not get a live process restarted)."""
    return {"status": "ok"}
