"""Reads and wire projections of gateway processes, their connections and presence."""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.db.models import Count, QuerySet
from django.utils import timezone

from openclaw_client.running_gateway import process_alive

from . import sql_reads
from .conf import gateway_setting
from .models import GatewayConnection, GatewayProcess
from .scopes import ROLE_NODE


def to_ms(value: datetime | None) -> int | None:
    return int(value.timestamp() * 1000) if value else None


def now_ms() -> int:
    return int(timezone.now().timestamp() * 1000)


def drop_empty(data: dict) -> dict:
    return {k: v for k, v in data.items() if v not in (None, "")}


# --- liveness -------------------------------------------------------------------------------


def process_stale_before() -> datetime:
    return timezone.now() - timedelta(milliseconds=gateway_setting("PROCESS_STALE_AFTER_MS"))


def live_connections() -> QuerySet[GatewayConnection]:
    """Connections whose gateway process is still heartbeating."""
    return GatewayConnection.objects.filter(process__heartbeat_at__gte=process_stale_before())


def live_node_connection(node_id: str) -> GatewayConnection | None:
    return live_connections().filter(role=ROLE_NODE, node_id=node_id).first()


def live_node_route(node_id: str) -> tuple[str, str, list[str]] | None:
    """``(channel_name, conn_id, commands)`` of the node's live connection: what an invoke needs, as
    values (it is looked up on every invoke and every node turn; building the instance cost more)."""
    row = live_connections().filter(role=ROLE_NODE, node_id=node_id).values_list("channel_name", "conn_id", "commands")
    return row.first()


def live_processes() -> QuerySet[GatewayProcess]:
    return GatewayProcess.objects.filter(heartbeat_at__gte=process_stale_before())


def stale_processes() -> QuerySet[GatewayProcess]:
    return GatewayProcess.objects.filter(heartbeat_at__lt=process_stale_before())


def dead_process_boot_ids() -> list[str]:
    """Processes that stopped heartbeating, and those of this host whose pid is gone (killed ones, known
    dead at once rather than after the heartbeat timeout)."""
    host = socket.gethostname()
    dead = {str(boot_id) for boot_id in stale_processes().values_list("boot_id", flat=True)}
    for boot_id, pid in live_processes().filter(hostname=host).values_list("boot_id", "pid"):
        if not process_alive(pid):
            dead.add(str(boot_id))
    return sorted(dead)


def live_process_boot_ids() -> set[str]:
    """Gateway processes that still heartbeat and, when on this host, still exist.

    The pid check notices a killed process at once instead of after the heartbeat timeout.
    """
    host = socket.gethostname()
    return {str(p.boot_id) for p in live_processes() if p.hostname != host or process_alive(p.pid)}


def live_processes_and_connection_counts() -> tuple[list[dict], dict[str, int]]:
    """For ``status``, which asks on every call: the live processes, oldest first, and the number of their
    connections per role (``operator`` and ``node`` always present)."""
    processes: dict = {}
    counts = {"operator": 0, "node": 0}
    # Counted per process and role (a process without connections gives one row with no role), in one query.
    rows = (
        GatewayProcess.objects.filter(heartbeat_at__gte=process_stale_before())
        .values_list("boot_id", "hostname", "pid", "heartbeat_at", "connections__role")
        .annotate(count=Count("connections"))
        .order_by("started_at", "boot_id", "connections__role")
    )
    for boot_id, hostname, pid, heartbeat_at, role, count in rows:
        if boot_id not in processes:
            processes[boot_id] = {
                "bootId": str(boot_id),
                "hostname": hostname,
                "pid": pid,
                "heartbeatAtMs": to_ms(heartbeat_at),
            }
        if role is not None:
            counts[role] = counts.get(role, 0) + count
    return list(processes.values()), counts


PRESENCE_MAX_ENTRIES = 100


# PostgreSQL: the presence state version is a sequence (migration 0003), raised and read with the list
# in one round trip, right after the write that changed presence when there is one.
PRESENCE_VERSION_SEQUENCE = "gateway_presence_version"


def presence_snapshot_sql(*, registered: str | None = None) -> tuple[str, dict]:
    """PostgreSQL: two statements, the presence version raised by one, then the rows of
    :func:`presence_entries` (the same query as :func:`_recent_connections`). With ``registered`` (a
    connection id), the version is raised only when that connection's row exists: a connect that
    did not register changes nothing. Each statement sees what committed before it began, so the
    list is read after the version was raised (a change after it raises it again)."""
    bump = f"SELECT nextval('{PRESENCE_VERSION_SEQUENCE}')"
    params = _presence_params()
    if registered is not None:
        bump += f" FROM {_CONNECTION_TABLE} WHERE conn_id = %(presence_registered)s"
        params["presence_registered"] = registered
    return f"{bump};\n{_PRESENCE_SQL}", params


def result_sets(cursor) -> list[list[tuple]]:
    """The rows of each statement of a multi-statement script that returns rows, in order."""
    results = []
    while True:
        if cursor.description is not None:
            results.append(cursor.fetchall())
        if not cursor.nextset():
            return results


def presence_rows_from_sql(rows: list[tuple]) -> list[tuple]:
    """Rows of :data:`_PRESENCE_SQL` as the ORM would hand them out: the scopes decoded (Django has the drivers
    hand JSON over as text) and the connect time aware (SQLite keeps UTC without an offset)."""
    return [
        (
            *row[:_SCOPES_AT],
            _json_value(row[_SCOPES_AT]),
            *row[_SCOPES_AT + 1 : _CONNECTED_AT],
            _aware(row[_CONNECTED_AT]),
            *row[_CONNECTED_AT + 1 :],
        )
        for row in rows
    ]


def _json_value(value):
    return json.loads(value) if isinstance(value, str) else value


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _presence_params() -> dict:
    cutoff = sql_reads.prepared(GatewayProcess._meta.get_field("heartbeat_at"), process_stale_before(), GatewayProcess)
    return {"presence_cutoff": cutoff, "presence_limit": PRESENCE_MAX_ENTRIES * 2}


def presence_entries(rows: list[tuple] | None = None) -> list[dict]:
    """One entry per device (or per connection without a device), newest connection first.

    Capped: every connect and disconnect broadcasts presence to every connection, so the list
    must not grow with the number of clients; ``status`` has the full counts. ``rows``: those
    :func:`presence_snapshot_sql` read, else they are read here.
    """
    entries: dict[str, dict] = {}
    # Rows as dicts of the columns used, not model instances: every connect's hello-ok reads this.
    if rows is None:
        rows = _recent_connections()
    for conn in (dict(zip(_PRESENCE_COLUMNS, row, strict=True)) for row in rows):
        key = conn["device_id"] or str(conn["conn_id"])
        entry = entries.get(key)
        if entry is None:
            if len(entries) >= PRESENCE_MAX_ENTRIES:
                continue
            connected_ms = to_ms(conn["connected_at"])
            entries[key] = drop_empty(
                {
                    "host": conn["display_name"],
                    "ip": conn["remote_ip"],
                    "version": conn["client_version"],
                    "platform": conn["platform"],
                    "deviceFamily": conn["device_family"],
                    "modelIdentifier": conn["model_identifier"],
                    "mode": conn["client_mode"],
                    "reason": "connect",
                    "deviceId": conn["device_id"],
                    "instanceId": conn["instance_id"],
                    "roles": [conn["role"]],
                    "scopes": list(conn["scopes"]),
                    "onlineSince": connected_ms,
                    "ts": connected_ms,
                }
            )
        elif conn["role"] not in entry["roles"]:
            entry["roles"].append(conn["role"])
    return list(entries.values())


def _recent_connections() -> list[tuple]:
    # Read on every connect's hello-ok and presence broadcast: SQL text, not a queryset compiled per call.
    with connection.cursor() as cursor:
        cursor.execute(_PRESENCE_SQL, _presence_params())
        return presence_rows_from_sql(cursor.fetchall())


_PRESENCE_COLUMNS = (
    "conn_id",
    "device_id",
    "display_name",
    "remote_ip",
    "client_version",
    "platform",
    "device_family",
    "model_identifier",
    "client_mode",
    "instance_id",
    "role",
    "scopes",
    "connected_at",
)
_SCOPES_AT = _PRESENCE_COLUMNS.index("scopes")
_CONNECTED_AT = _PRESENCE_COLUMNS.index("connected_at")
_CONNECTION_TABLE = GatewayConnection._meta.db_table
# The query of _recent_connections as SQL text, to be sent after other statements in one round trip.
_PRESENCE_SQL = (
    f"SELECT {', '.join(f'c.{name}' for name in _PRESENCE_COLUMNS)} FROM {_CONNECTION_TABLE} c "
    f"INNER JOIN {GatewayProcess._meta.db_table} p ON c.process_id = p.boot_id "
    "WHERE p.heartbeat_at >= %(presence_cutoff)s ORDER BY c.connected_at DESC LIMIT %(presence_limit)s"
)
