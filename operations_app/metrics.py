"""What ``/metrics`` reads at scrape time, and the registry each scrape is rendered from (docs/operations.md).

The gateway's instruments (``gateway.metrics``) count events as they happen, in every process. The state of
the system — runs queued and running, placements, nodes and worker slots, pending pairing requests and exec
approvals, the Celery queue, this process's database pool — is read when Prometheus asks, by
:class:`GatewayStateCollector`, through the apps' selectors (a handful of indexed counts). It is the same
whichever process answers, so in the cluster one scrape through the balancer sees it once.

A part that cannot be read (the database or the broker down) is left out of the scrape and
``openclaw_state_source_up{source}`` says 0, so the counters of the processes still come through.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

from django.conf import settings
from django.db import connections
from django.utils import timezone
from kombu import Connection
from kombu.exceptions import ChannelError
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from approvals_app import selectors as approval_selectors
from devices_app import selectors as device_selectors
from gateway import selectors as gateway_selectors
from sessions_app import selectors as session_selectors
from workers_app import selectors as worker_selectors

logger = logging.getLogger(__name__)

MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
# A scrape must answer even when the broker does not: Prometheus' default scrape timeout is 10 s.
BROKER_TIMEOUT_S = 2


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _labelled(name: str, documentation: str, label: str, values: dict[str, int]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=(label,))
    for label_value, value in sorted(values.items()):
        family.add_metric((label_value,), value)
    return family


def database_state() -> list[Metric]:
    """Every gauge read from the database, in one list: all of them or (the database failing) none."""
    runs = session_selectors.active_run_counts()
    oldest = session_selectors.oldest_running_run_started_at()
    _processes, connection_counts = gateway_selectors.live_processes_and_connection_counts()
    return [
        _labelled("openclaw_runs", "Runs (turns) queued or running now, by status.", "status", runs),
        _gauge(
            "openclaw_oldest_running_run_age_seconds",
            "How long the oldest running run has run (0 when none runs).",
            (timezone.now() - oldest).total_seconds() if oldest is not None else 0.0,
        ),
        _labelled(
            "openclaw_placements", "Session placements by state.", "state", worker_selectors.placement_counts_by_state()
        ),
        _gauge(
            "openclaw_nodes_connected",
            "Nodes connected to a live gateway process (all processes).",
            connection_counts.get("node", 0),
        ),
        _labelled(
            "openclaw_worker_slots",
            "Worker slots the connected session-host nodes declare, busy and free.",
            "state",
            worker_selectors.worker_slot_totals(),
        ),
        _gauge(
            "openclaw_pairing_requests_pending",
            "Device and node pairing requests waiting for an operator (not yet expired).",
            device_selectors.open_pairing_requests().count(),
        ),
        _gauge(
            "openclaw_exec_approvals_pending",
            "Exec approvals waiting for a decision (not yet expired).",
            approval_selectors.pending_approvals().count(),
        ),
    ]


def celery_queue_depth() -> int | None:
    """Messages waiting in the deployment's Celery queue, through kombu's ``queue_declare(passive=True)`` (its
    message count, on Redis the lengths of the queue's lists); None where tasks run in the gateway process."""
    if settings.OPENCLAW_TASK_MODE != "celery":
        return None
    options = {
        **getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}),
        "max_retries": 1,
        "socket_timeout": BROKER_TIMEOUT_S,
        "socket_connect_timeout": BROKER_TIMEOUT_S,
    }
    with Connection(settings.CELERY_BROKER_URL, connect_timeout=BROKER_TIMEOUT_S, transport_options=options) as broker:
        broker.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_S)
        try:
            return broker.default_channel.queue_declare(
                queue=settings.CELERY_TASK_DEFAULT_QUEUE, passive=True
            ).message_count
        except ChannelError:
            return 0  # no such queue (yet): on Redis an empty queue has no list at all


def database_pool_stats() -> dict[str, int] | None:
    """psycopg_pool's ``get_stats()`` of this process's pool (PostgreSQL), through the connection's public ``pool``;
    None on SQLite (no pool)."""
    pool = getattr(connections["default"], "pool", None)
    return pool.get_stats() if pool is not None else None


class GatewayStateCollector:
    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "openclaw_state_source_up",
            "Whether this scrape could read the source of the state gauges (database, broker).",
            labels=("source",),
        )
        try:
            families = database_state()
        except Exception:
            # Logged with its traceback; the scrape still carries every counter and says the database is down.
            logger.exception("metrics: reading the gateway's state from the database failed")
            up.add_metric(("database",), 0)
        else:
            up.add_metric(("database",), 1)
            yield from families
        try:
            depth = celery_queue_depth()
        except Exception:
            logger.exception("metrics: reading the Celery queue depth from the broker failed")
            up.add_metric(("broker",), 0)
        else:
            if depth is not None:
                up.add_metric(("broker",), 1)
                yield _labelled(
                    "openclaw_celery_queue_depth",
                    "Tasks waiting in the Celery queue of this deployment.",
                    "queue",
                    {settings.CELERY_TASK_DEFAULT_QUEUE: depth},
                )
        yield up
        stats = database_pool_stats()
        if stats is not None:
            size, available = stats.get("pool_size", 0), stats.get("pool_available", 0)
            yield _labelled(
                "openclaw_db_pool_connections",
                "The answering process's PostgreSQL pool: connections in use and idle (psycopg_pool get_stats).",
                "state",
                {"in_use": max(size - available, 0), "idle": available},
            )
            yield _gauge(
                "openclaw_db_pool_requests_waiting",
                "Requests waiting for a connection of the answering process's pool.",
                stats.get("requests_waiting", 0),
            )


class ProcessRegistryCollector:
    """The instruments of this one process (prometheus_client's default registry), for a single-process gateway."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def scrape_registry() -> CollectorRegistry:
    """A registry for one scrape: every process's instruments (multiprocess mode: summed from their files) or this
    process's, and the state read now."""
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get(MULTIPROCESS_DIR_ENV):
        MultiProcessCollector(registry)
    else:
        registry.register(ProcessRegistryCollector())
    registry.register(GatewayStateCollector())
    return registry
