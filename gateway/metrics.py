"""The gateway's Prometheus instruments, and the few functions that record into them (docs/operations.md, Metrics).

Every process keeps its own values; ``manage.py cluster`` sets ``PROMETHEUS_MULTIPROC_DIR`` for each of its
programs, so prometheus_client writes them to files there and ``/metrics`` adds them up over the processes
(``operations_app.metrics``). What is read from the database at scrape time (runs, placements, nodes, pending
requests, queue depth) is not here: ``operations_app.metrics`` collects it.

Cardinality is bounded by construction: no session key, run id, device id or address is ever a label; method
names come from the registry ("unknown" otherwise); every other free-form label (error codes, model names,
failure reasons, task names) goes through :class:`BoundedLabel`, which admits a fixed number of distinct values
per process and answers "other" after that.

``OPENCLAW_METRICS_ENABLED=0`` turns every record function into a return (and ``/metrics`` into a 404): the
benchmark measures the hot path with and without them.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from prometheus_client import Counter, Gauge, Histogram

from .registry import registry

UNKNOWN = "unknown"
OTHER = "other"

# Seconds. RPC calls: from tens of microseconds (health) to a node invoke's timeout.
RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# A turn: one echo reply to an hour-long tool loop (OPENCLAW_TURN_TIMEOUT_S).
TURN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
MODEL_CALL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


@functools.cache
def metrics_enabled() -> bool:
    # Read once: this is on every call's path. Tests that change the setting clear it (below).
    return settings.OPENCLAW_METRICS_ENABLED


@receiver(setting_changed)
def _setting_changed(*, setting: str, **kwargs) -> None:
    if setting == "OPENCLAW_METRICS_ENABLED":
        metrics_enabled.cache_clear()


class BoundedLabel:
    """The first ``limit`` distinct values seen in this process pass through; later new ones become "other".

    For labels whose values come from the code (error codes, reasons) or from configuration (model names):
    the limit is a guard against a value that turns out to vary, not a filter of expected ones.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.seen: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, value: str | None) -> str:
        if not value:
            return UNKNOWN
        if value in self.seen:
            return value
        with self.lock:
            if len(self.seen) >= self.limit:
                return OTHER
            self.seen.add(value)
        return value


# --- RPC ------------------------------------------------------------------------------------------

# One histogram for both: its ``_count`` is the calls by method and outcome, its buckets their latency. A counter
# beside it would double the work on every call's path for a number the histogram already has.
RPC_CALLS = Histogram(
    "openclaw_rpc_duration_seconds",
    "Gateway RPC calls answered, by method and outcome (ok or the error code): time from dispatch to answer.",
    ("method", "outcome"),
    buckets=RPC_BUCKETS,
)
error_code_label = BoundedLabel(32)

# The labelled children, looked up once per (method, outcome): ``labels()`` takes a lock and builds a key on
# every call, and this is on every request's path. Keyed after the method is bounded, so it stays small.
_rpc_children: dict[tuple[str, str], Histogram] = {}


def rpc_method_label(method: str) -> str:
    return method if method in registry.methods else UNKNOWN


def record_rpc_call(method: str, outcome: str, seconds: float) -> None:
    """``outcome`` is "ok" or the error's protocol code; ``method`` as the client sent it."""
    if not metrics_enabled():
        return
    key = (rpc_method_label(method), outcome)
    child = _rpc_children.get(key)
    if child is None:
        child = _rpc_children[key] = RPC_CALLS.labels(key[0], "ok" if outcome == "ok" else error_code_label(outcome))
    child.observe(seconds)


# --- connections and handshakes -------------------------------------------------------------------

CONNECTIONS = Gauge(
    "openclaw_gateway_connections",
    "Open (authenticated) gateway WebSocket connections, by role.",
    ("role",),
    # Summed over the live processes; a process that died takes its connections with it.
    multiprocess_mode="livesum",
)
HANDSHAKES = Counter(
    "openclaw_gateway_handshakes",
    "Gateway WebSocket handshakes that ended, by result (ok or failed).",
    ("result",),
)
HANDSHAKE_FAILURES = Counter(
    "openclaw_gateway_handshake_failures",
    "Handshakes that did not open a connection, by reason (a close reason or the error's detail code).",
    ("reason",),
)
SLOW_CONSUMER_DISCONNECTS = Counter(
    "openclaw_gateway_slow_consumer_disconnects",
    "Connections closed because more than maxBufferedBytes waited for them (1008 slow consumer).",
)
HTTP_HEADS_REFUSED = Counter(
    "openclaw_gateway_http_heads_refused",
    "HTTP connections answered before their request head was complete, by reason: timeout (408, the head deadline "
    "passed), address-limit (429, the client address holds too many slow heads) or body-too-large (413, a body "
    "over its cap, refused before it is taken).",
    ("reason",),
)
handshake_reason_label = BoundedLabel(64)


def connection_opened(role: str) -> None:
    if metrics_enabled():
        CONNECTIONS.labels(role).inc()


def connection_closed(role: str) -> None:
    if metrics_enabled():
        CONNECTIONS.labels(role).dec()


def record_handshake_ok() -> None:
    if metrics_enabled():
        HANDSHAKES.labels("ok").inc()


def record_handshake_failure(reason: str) -> None:
    if metrics_enabled():
        HANDSHAKES.labels("failed").inc()
        HANDSHAKE_FAILURES.labels(handshake_reason_label(reason)).inc()


def record_slow_consumer_disconnect() -> None:
    if metrics_enabled():
        SLOW_CONSUMER_DISCONNECTS.inc()


def record_http_head_refused(reason: str) -> None:
    """``reason``: ``timeout``, ``address-limit`` or ``body-too-large`` (fixed by the code)."""
    if metrics_enabled():
        HTTP_HEADS_REFUSED.labels(reason).inc()


# --- authentication -------------------------------------------------------------------------------

AUTH_FAILURES = Counter(
    "openclaw_auth_failures",
    "Refused credentials at connect (shared secret, device token, device proof), by reason.",
    ("reason",),
)
AUTH_LOCKOUTS = Counter(
    "openclaw_auth_lockouts",
    "Client addresses locked out by the brute-force limiter, by limiter (shared-secret, device-token, admin-login).",
    ("limiter",),
)
auth_reason_label = BoundedLabel(32)
limiter_label = BoundedLabel(8)


def record_auth_failure(reason: str) -> None:
    if metrics_enabled():
        AUTH_FAILURES.labels(auth_reason_label(reason)).inc()


def record_auth_lockout(limiter: str) -> None:
    if metrics_enabled():
        AUTH_LOCKOUTS.labels(limiter_label(limiter)).inc()


# --- turns and models -----------------------------------------------------------------------------

TURNS = Counter("openclaw_turns", "Turns that ended, by status (ok, error, aborted).", ("status",))
TURN_DURATION = Histogram(
    "openclaw_turn_duration_seconds",
    "A turn from its start (claimed by an executor) to its end, by status.",
    ("status",),
    buckets=TURN_BUCKETS,
)
MODEL_CALL_DURATION = Histogram(
    "openclaw_model_call_seconds",
    "One model call of a gateway turn (request to the last streamed chunk), by provider.",
    ("provider",),
    buckets=MODEL_CALL_BUCKETS,
)
MODEL_TOKENS = Counter(
    "openclaw_model_tokens",
    "Tokens of finished turns as the provider reported them, by model and direction (in, out).",
    ("model", "direction"),
)
model_label = BoundedLabel(64)
provider_label = BoundedLabel(16)
turn_status_label = BoundedLabel(8)


def record_turn_end(*, status: str, seconds: float | None, model: str, tokens_in: int, tokens_out: int) -> None:
    if not metrics_enabled():
        return
    status = turn_status_label(status)
    TURNS.labels(status).inc()
    if seconds is not None:
        TURN_DURATION.labels(status).observe(max(seconds, 0.0))
    if tokens_in or tokens_out:
        model = model_label(model)
        MODEL_TOKENS.labels(model, "in").inc(max(tokens_in, 0))
        MODEL_TOKENS.labels(model, "out").inc(max(tokens_out, 0))


def record_model_call(provider: str, seconds: float) -> None:
    if metrics_enabled():
        MODEL_CALL_DURATION.labels(provider_label(provider)).observe(seconds)


# --- recovery -------------------------------------------------------------------------------------

RECOVERY_TRANSITIONS = Counter(
    "openclaw_recovery_transitions",
    "What worker recovery changed, by pass (startup, sweep, node-removed) and reason (what it found and did).",
    ("phase", "reason"),
)
recovery_reason_label = BoundedLabel(64)
recovery_phase_label = BoundedLabel(8)


def record_recovery_transitions(phase: str, reasons: Iterable[tuple[str, int]]) -> None:
    if not metrics_enabled():
        return
    phase = recovery_phase_label(phase)
    for reason, count in reasons:
        if count > 0:
            RECOVERY_TRANSITIONS.labels(phase, recovery_reason_label(reason)).inc(count)


# --- Celery ---------------------------------------------------------------------------------------

CELERY_TASKS = Counter(
    "openclaw_celery_tasks",
    "Celery task executions that ended in a worker, by task name and outcome (success, failure, retry).",
    ("task", "outcome"),
)
task_label = BoundedLabel(64)


def record_task_outcome(task_name: str | None, outcome: str) -> None:
    if metrics_enabled():
        CELERY_TASKS.labels(task_label(task_name), outcome).inc()
