"""Reads and wire projections for devices, pairing requests, nodes and connections."""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import datetime, timedelta

from django.core.cache import cache
from django.db import transaction
from django.db.models import Count, QuerySet
from django.utils import timezone

from . import counters
from .conf import gateway_setting
from .models import (
    DevicePairingRequest,
    DeviceToken,
    GatewayConnection,
    GatewayProcess,
    PairedDevice,
    PairingStatus,
)
from .node_commands import public_commands
from .registry import registry
from .scopes import ROLE_NODE

EXEC_COMMANDS = frozenset({"system.run", "system.run.prepare", "system.which"})


def to_ms(value: datetime | None) -> int | None:
    return int(value.timestamp() * 1000) if value else None


def now_ms() -> int:
    return int(timezone.now().timestamp() * 1000)


def _drop_empty(data: dict) -> dict:
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
        if not _pid_exists(pid):
            dead.add(str(boot_id))
    return sorted(dead)


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_process_boot_ids() -> set[str]:
    """Gateway processes that still heartbeat and, when on this host, still exist.

    The pid check notices a killed process at once instead of after the heartbeat timeout.
    """
    host = socket.gethostname()
    return {str(p.boot_id) for p in live_processes() if p.hostname != host or _pid_exists(p.pid)}


# --- pairing --------------------------------------------------------------------------------


def open_pairing_requests(*, role: str | None = None) -> QuerySet[DevicePairingRequest]:
    qs = DevicePairingRequest.objects.filter(status=PairingStatus.PENDING, expires_at__gt=timezone.now())
    if role is not None:
        qs = qs.filter(role=role)
    return qs.order_by("-created_at")


def pairing_request_shape(request: DevicePairingRequest) -> dict:
    return _drop_empty(
        {
            "requestId": str(request.request_id),
            "deviceId": request.device_id,
            "publicKey": request.public_key,
            "displayName": request.display_name,
            "platform": request.platform,
            "deviceFamily": request.device_family,
            "clientId": request.client_id,
            "clientMode": request.client_mode,
            "role": request.role,
            "roles": [request.role],
            "scopes": list(request.scopes),
            "remoteIp": request.remote_ip,
            "silent": request.silent,
            "isRepair": request.is_repair,
            "reason": request.reason,
            "ts": to_ms(request.created_at),
        }
    )


def node_pairing_request_shape(request: DevicePairingRequest) -> dict:
    return _drop_empty(
        {
            "requestId": str(request.request_id),
            "nodeId": request.device_id,
            "displayName": request.display_name,
            "platform": request.platform,
            "version": request.client_version,
            "deviceFamily": request.device_family,
            "modelIdentifier": request.model_identifier,
            "caps": sorted(set(request.caps)),
            "commands": public_commands(request.commands),
            "permissions": request.permissions or None,
            "remoteIp": request.remote_ip,
            "silent": request.silent,
            "isRepair": request.is_repair,
            "ts": to_ms(request.created_at),
        }
    )


def token_summary(token: DeviceToken) -> dict:
    return _drop_empty(
        {
            "role": token.role,
            "scopes": list(token.scopes),
            "createdAtMs": to_ms(token.created_at),
            "rotatedAtMs": to_ms(token.rotated_at),
            "revokedAtMs": to_ms(token.revoked_at),
            "lastUsedAtMs": to_ms(token.last_used_at),
        }
    )


def paired_device_shape(device: PairedDevice, *, connected: bool) -> dict:
    shape = _drop_empty(
        {
            "deviceId": device.device_id,
            "publicKey": device.public_key,
            "displayName": device.display_name,
            "operatorLabel": device.operator_label,
            "platform": device.platform,
            "deviceFamily": device.device_family,
            "clientId": device.client_id,
            "clientMode": device.client_mode,
            "role": device.roles[0] if device.roles else None,
            "roles": list(device.roles),
            "scopes": list(device.approved_scopes),
            "remoteIp": device.remote_ip,
            "createdAtMs": to_ms(device.created_at),
            "approvedAtMs": to_ms(device.approved_at),
            "lastSeenAtMs": to_ms(device.last_seen_at),
            "lastSeenReason": device.last_seen_reason,
        }
    )
    shape["tokens"] = [token_summary(t) for t in device.tokens.all()]
    shape["connected"] = connected
    return shape


def device_pair_list(*, only_device_id: str | None = None) -> dict:
    pending = open_pairing_requests()
    devices = PairedDevice.objects.prefetch_related("tokens").order_by("-approved_at")
    if only_device_id is not None:
        pending = pending.filter(device_id=only_device_id)
        devices = devices.filter(device_id=only_device_id)
    connected_ids = set(live_connections().exclude(device_id="").values_list("device_id", flat=True).distinct())
    return {
        "pending": [pairing_request_shape(r) for r in pending],
        "paired": [paired_device_shape(d, connected=d.device_id in connected_ids) for d in devices],
    }


def paired_node_shape(device: PairedDevice) -> dict:
    return _drop_empty(
        {
            "nodeId": device.device_id,
            "displayName": device.label,
            "platform": device.platform,
            "version": device.client_version,
            "deviceFamily": device.device_family,
            "modelIdentifier": device.model_identifier,
            "caps": sorted(set(device.approved_caps)),
            "commands": public_commands(device.approved_commands),
            "permissions": device.approved_permissions or None,
            "remoteIp": device.remote_ip,
            "createdAtMs": to_ms(device.created_at),
            "approvedAtMs": to_ms(device.approved_at),
            "lastConnectedAtMs": to_ms(device.last_connected_at),
        }
    )


def node_pair_list() -> dict:
    return {
        "pending": [node_pairing_request_shape(r) for r in open_pairing_requests(role=ROLE_NODE)],
        "paired": [paired_node_shape(d) for d in PairedDevice.objects.filter(is_node=True).order_by("-approved_at")],
    }


# --- node catalog ---------------------------------------------------------------------------


def node_catalog(*, include_pending: bool) -> list[dict]:
    """Known nodes: paired node devices | pending node requests | live node connections.

    Three queries whatever the number of nodes; sorted connected first, then by name, then id.
    """
    live = {c.node_id: c for c in live_connections().filter(role=ROLE_NODE)}
    paired = {d.device_id: d for d in PairedDevice.objects.filter(is_node=True)}
    pending = {}
    if include_pending:
        for request in open_pairing_requests(role=ROLE_NODE):
            pending.setdefault(request.device_id, request)
    node_ids = set(live) | set(paired) | set(pending)
    nodes = [_node_entry(nid, live.get(nid), paired.get(nid), pending.get(nid)) for nid in node_ids]
    for contributor in registry.node_projections:
        extra = contributor(node_ids, live)
        for node in nodes:
            node.update(extra.get(node["nodeId"], {}))
    nodes.sort(key=lambda n: (not n["connected"], (n.get("displayName") or n["nodeId"]).lower(), n["nodeId"]))
    return nodes


def _first(*values):
    """The first non-empty value: live connection data wins over stored data."""
    for value in values:
        if value:
            return value
    return None


def _node_entry(
    node_id: str,
    conn: GatewayConnection | None,
    device: PairedDevice | None,
    request: DevicePairingRequest | None,
) -> dict:
    if conn is not None:
        commands, caps, permissions = public_commands(conn.commands), sorted(set(conn.caps)), conn.permissions or None
    elif device is not None:
        commands = public_commands(device.approved_commands)
        caps = sorted(set(device.approved_caps))
        permissions = device.approved_permissions or None
    else:
        commands, caps, permissions = [], [], None

    if device is not None:
        approval_state = "pending-reapproval" if request is not None else "approved"
    else:
        approval_state = "pending-approval" if request is not None else "unapproved"

    def field(name: str, conn_attr: str | None = None, device_attr: str | None = None):
        return _first(
            getattr(conn, conn_attr or name, None) if conn else None,
            getattr(device, device_attr or name, None) if device else None,
            getattr(request, device_attr or name, None) if request else None,
        )

    entry = {
        "nodeId": node_id,
        # An operator's rename wins over what the node announces.
        "displayName": _first(device.operator_label if device else None, field("display_name")),
        "platform": field("platform"),
        "version": field("client_version"),
        "clientId": field("client_id"),
        "clientMode": field("client_mode"),
        "deviceFamily": field("device_family"),
        "modelIdentifier": field("model_identifier"),
        "remoteIp": field("remote_ip"),
        "caps": caps,
        "commands": commands,
        "permissions": permissions,
        "pathEnv": conn.path_env if conn else None,
        "paired": device is not None,
        "connected": conn is not None,
        "connectedAtMs": to_ms(conn.connected_at) if conn else None,
        "lastConnectedAtMs": to_ms(conn.connected_at) if conn else to_ms(device.last_connected_at if device else None),
        "lastDisconnectedAtMs": to_ms(device.last_disconnected_at) if device else None,
        "lastSeenAtMs": to_ms(conn.connected_at) if conn else to_ms(device.last_seen_at if device else None),
        "lastSeenReason": "connect" if conn else (device.last_seen_reason if device else None),
        "approvedAtMs": to_ms(device.approved_at) if device else None,
        "approvalState": approval_state,
    }
    if request is not None:
        entry["pendingRequestId"] = str(request.request_id)
        entry["pendingDeclaredCaps"] = sorted(set(request.caps))
        entry["pendingDeclaredCommands"] = public_commands(request.commands)
        entry["pendingDeclaredPermissions"] = request.permissions or {}
    return {k: v for k, v in entry.items() if v is not None and v != ""}


NODE_CATALOG_VERSION_KEY = "gateway:node-catalog:version"
# Bounds how late a node whose gateway process died shows as disconnected (no event marks that).
NODE_CATALOG_MAX_AGE_S = 2.0
# How late another process's change shows here: the shared version is read at most this often.
NODE_CATALOG_VERSION_CHECK_S = 0.25
_node_catalog_memo: dict = {"version": None, "at": 0.0, "checked_at": 0.0, "nodes": None}


def node_catalog_changed() -> None:
    """Invalidate every process's memoized node catalog once the current transaction commits."""

    def bump() -> None:
        _node_catalog_memo["nodes"] = None  # this process sees its own change at once
        counters.bump(NODE_CATALOG_VERSION_KEY)

    transaction.on_commit(bump)


def node_catalog_snapshot() -> list[dict]:
    """``node_catalog`` memoized per process until a catalog change or for at most 2 s.

    node.list is called far more often than nodes pair, connect or get renamed; this saves the
    three queries on the common path. A change made here shows at once, one made by another
    gateway process within 250 ms. Treat the result as read-only.
    """
    memo = _node_catalog_memo
    now = time.monotonic()
    fresh = memo["nodes"] is not None and now - memo["at"] < NODE_CATALOG_MAX_AGE_S
    if fresh and now - memo["checked_at"] < NODE_CATALOG_VERSION_CHECK_S:
        return memo["nodes"]
    version = cache.get(NODE_CATALOG_VERSION_KEY, 0)
    if fresh and memo["version"] == version:
        memo["checked_at"] = now
        return memo["nodes"]
    nodes = node_catalog(include_pending=True)
    memo.update(version=version, at=now, checked_at=now, nodes=nodes)
    return nodes


def strip_pending_fields(node: dict) -> dict:
    return {k: v for k, v in node.items() if not k.startswith("pending")}


def node_describe(node_id: str) -> dict | None:
    for node in node_catalog_snapshot():
        if node["nodeId"] == node_id:
            return node
    return None


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
    params: dict = {"presence_cutoff": process_stale_before(), "presence_limit": PRESENCE_MAX_ENTRIES * 2}
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
    """Rows of :data:`_PRESENCE_SQL` as :func:`_recent_connections` returns them (its JSON column decoded)."""
    return [(*row[:_SCOPES_AT], _json_value(row[_SCOPES_AT]), *row[_SCOPES_AT + 1 :]) for row in rows]


def _json_value(value):
    # Django has psycopg hand jsonb over as text (its JSONField decodes it).
    return json.loads(value) if isinstance(value, str) else value


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
            entries[key] = _drop_empty(
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


def _recent_connections() -> list[tuple]:
    return list(
        GatewayConnection.objects.filter(process__heartbeat_at__gte=process_stale_before())
        .order_by("-connected_at")
        .values_list(*_PRESENCE_COLUMNS)[: PRESENCE_MAX_ENTRIES * 2]
    )


_CONNECTION_TABLE = GatewayConnection._meta.db_table
# The query of _recent_connections as SQL text, to be sent after other statements in one round trip.
_PRESENCE_SQL = (
    f"SELECT {', '.join(f'c.{name}' for name in _PRESENCE_COLUMNS)} FROM {_CONNECTION_TABLE} c "
    f"INNER JOIN {GatewayProcess._meta.db_table} p ON c.process_id = p.boot_id "
    "WHERE p.heartbeat_at >= %(presence_cutoff)s ORDER BY c.connected_at DESC LIMIT %(presence_limit)s"
)
