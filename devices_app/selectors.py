"""Reads and wire projections of devices, pairing requests, device tokens and the node catalog."""

from __future__ import annotations

import time

from django.core.cache import cache
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from gateway import counters
from gateway.models import GatewayConnection
from gateway.node_commands import public_commands
from gateway.scopes import ROLE_NODE
from gateway.selectors import drop_empty, live_connections, to_ms

from .models import DevicePairingRequest, DeviceToken, PairedDevice, PairingStatus
from .ports import node_workers

EXEC_COMMANDS = frozenset({"system.run", "system.run.prepare", "system.which"})


# --- pairing --------------------------------------------------------------------------------


def open_pairing_requests(*, role: str | None = None) -> QuerySet[DevicePairingRequest]:
    qs = DevicePairingRequest.objects.filter(status=PairingStatus.PENDING, expires_at__gt=timezone.now())
    if role is not None:
        qs = qs.filter(role=role)
    return qs.order_by("-created_at")


def pairing_request_shape(request: DevicePairingRequest) -> dict:
    return drop_empty(
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
    return drop_empty(
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
    return drop_empty(
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
    shape = drop_empty(
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
    return drop_empty(
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
    extra = node_workers().node_fields(node_ids, live)
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
        # OpenClaw's node.list shows the latest sample also once the node is offline (its lastHostStats).
        "hostStats": device.host_stats if device else None,
    }
    if conn is not None and device is not None:
        # What the node declared on its current connection (cleared when it connects again), as OpenClaw shows
        # its live session's: the tools with their descriptors, the skills without their content.
        entry["nodePluginTools"] = list(device.node_plugin_tools or [])
        entry["nodeSkills"] = [
            {"name": skill["name"], "description": skill["description"]} for skill in device.node_skills or []
        ]
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


def node_catalog_memoized() -> list[dict] | None:
    """What :func:`node_catalog_snapshot` answers, when it would answer without any read (its memo is fresh and
    was checked against the shared version within :data:`NODE_CATALOG_VERSION_CHECK_S`); None otherwise."""
    memo = _node_catalog_memo
    nodes = memo["nodes"]
    now = time.monotonic()
    if (
        nodes is not None
        and now - memo["at"] < NODE_CATALOG_MAX_AGE_S
        and now - memo["checked_at"] < NODE_CATALOG_VERSION_CHECK_S
    ):
        return nodes
    return None


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
