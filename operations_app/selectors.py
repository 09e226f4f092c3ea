"""The operations app's reads: what the console's System page shows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Q

from gateway import selectors as gateway_selectors
from gateway import state
from gateway.models import GatewayProcess
from gateway.protocol import SERVER_VERSION

from .models import RecordedError

PROCESSES_SHOWN = 100
ERRORS_SHOWN = 50


@dataclass(frozen=True)
class ProcessRow:
    boot_id: str
    hostname: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    live: bool
    this_process: bool
    operators: int
    nodes: int


def gateway_processes() -> list[ProcessRow]:
    """Registered gateway processes, oldest first, with their open connections by role (one query)."""
    stale_before = gateway_selectors.process_stale_before()
    rows = GatewayProcess.objects.annotate(
        operators=Count("connections", filter=Q(connections__role="operator")),
        nodes=Count("connections", filter=Q(connections__role="node")),
    ).order_by("started_at", "boot_id")[:PROCESSES_SHOWN]
    return [
        ProcessRow(
            boot_id=str(process.boot_id),
            hostname=process.hostname,
            pid=process.pid,
            started_at=process.started_at,
            heartbeat_at=process.heartbeat_at,
            live=process.heartbeat_at >= stale_before,
            this_process=str(process.boot_id) == state.BOOT_ID,
            operators=process.operators,
            nodes=process.nodes,
        )
        for process in rows
    ]


def server_version() -> str:
    return SERVER_VERSION


def recent_errors(limit: int = ERRORS_SHOWN) -> list[RecordedError]:
    return list(RecordedError.objects.order_by("-id")[:limit])
