"""Node worker-host declarations (workers.md §5.1): recorded per connection, read by node rows and dispatch."""

from __future__ import annotations

from devices_app import selectors as device_selectors
from gateway import selectors as gateway_selectors
from gateway.selectors import now_ms

from ..models import NodeWorkerHost
from .inventory import Declaration


def node_host_declare(*, node_id: str, conn_id: str, declaration: Declaration) -> NodeWorkerHost:
    """Replace the node's declaration with this connection's (the newest connection's word wins)."""
    host, _ = NodeWorkerHost.objects.update_or_create(
        node_id=node_id,
        defaults={
            "conn_id": conn_id,
            "protocol_features": declaration.protocol_features,
            "worker_host": declaration.worker_host,
            "update_required": declaration.update_required,
            # What this connection's node holds is unknown until it answers a retain.
            "bundle_hash": "",
            "bundle_status": "",
            "updated_at_ms": now_ms(),
        },
    )
    # node.list rows show the declaration: every process's memoized catalog must be refreshed.
    device_selectors.node_catalog_changed()
    return host


def node_bundle_record(*, node_id: str, bundle_hash: str, status: str, conn_id: str | None = None) -> bool:
    """Record whether the node (on ``conn_id``, default its live connection) holds the bundle ``bundle_hash``."""
    if conn_id is None:
        connection = gateway_selectors.live_node_connection(node_id)
        if connection is None:
            return False
        conn_id = str(connection.conn_id)
    updated = NodeWorkerHost.objects.filter(node_id=node_id, conn_id=conn_id).update(
        bundle_hash=bundle_hash, bundle_status=status, updated_at_ms=now_ms()
    )
    if updated:
        device_selectors.node_catalog_changed()
    return bool(updated)


def node_bundle_installed(node_id: str, bundle_hash: str) -> bool:
    """Did the node's live connection report (or receive) the bundle ``bundle_hash`` installed?"""
    connection = gateway_selectors.live_node_connection(node_id)
    if connection is None:
        return False
    return NodeWorkerHost.objects.filter(
        node_id=node_id, conn_id=str(connection.conn_id), bundle_hash=bundle_hash, bundle_status="installed"
    ).exists()


def node_offers(node_id: str, flag: str) -> bool:
    """Whether the node's live connection declared the worker-host feature ``flag`` (say, ``bundlePrewarm``)."""
    connection = gateway_selectors.live_node_connection(node_id)
    if connection is None:
        return False
    host = NodeWorkerHost.objects.filter(node_id=node_id, conn_id=str(connection.conn_id)).first()
    return bool(host and host.worker_host and host.worker_host.get(flag))
